"""A deterministic synthetic corpus in Penn Treebank format, the project's default
language-modelling data (the real PTB training split is not redistributed here).

The text imitates PTB's surface statistics: lowercase words, ``<unk>`` and ``N`` (for
numbers) as frequent tokens, one sentence per line with a mean of about 21 words, and a
Zipf-like word frequency distribution over a fixed vocabulary. It also has learnable
local structure: every word belongs to one of a few word classes, the class sequence is
a Markov chain, and with some probability a word is the fixed preferred successor of
the previous word in its class. A language model can therefore get below the unigram
entropy of the text.
"""

import os

import numpy as np

__all__ = ["write_synthetic_corpus"]

# Word classes: name and number of word types (None: an open class that shares the
# rest of the vocabulary by _OPEN_SHARE).
_CLASSES = (
    ("det", 25),  # 0 determiners
    ("noun", None),  # 1 nouns (includes <unk>)
    ("verb", None),  # 2 verbs
    ("adj", None),  # 3 adjectives
    ("prep", 40),  # 4 prepositions
    ("adv", None),  # 5 adverbs
    ("num", 30),  # 6 numbers (includes N)
    ("conj", 30),  # 7 conjunctions / pronouns
)
_OPEN_SHARE = {1: 0.50, 2: 0.25, 3: 0.17, 5: 0.08}

# Class Markov chain: row = previous class, column = next class.
_TRANSITIONS = np.array(
    [
        # det   noun  verb  adj   prep  adv   num   conj
        [0.00, 0.62, 0.02, 0.30, 0.00, 0.02, 0.04, 0.00],  # det
        [0.04, 0.18, 0.34, 0.02, 0.26, 0.04, 0.02, 0.10],  # noun
        [0.34, 0.16, 0.04, 0.08, 0.16, 0.12, 0.06, 0.04],  # verb
        [0.00, 0.80, 0.02, 0.10, 0.04, 0.00, 0.02, 0.02],  # adj
        [0.50, 0.24, 0.02, 0.10, 0.00, 0.02, 0.12, 0.00],  # prep
        [0.06, 0.04, 0.56, 0.18, 0.08, 0.02, 0.02, 0.04],  # adv
        [0.02, 0.56, 0.06, 0.04, 0.16, 0.02, 0.10, 0.04],  # num
        [0.30, 0.24, 0.26, 0.06, 0.02, 0.06, 0.06, 0.00],  # conj
    ]
)
_START = np.array([0.34, 0.22, 0.02, 0.06, 0.10, 0.06, 0.04, 0.16])

_ONSETS = (
    "b c d f g h j k l m n p r s t v w z bl br ch cl cr dr fl fr gl gr pl pr sh sl sp st str th tr"
).split()
_VOWELS = "a e i o u ai ea ee io ou".split()
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck"]


def _make_words(rng, count):
    """``count`` distinct lowercase pseudo-words, shortest first (so the most frequent
    ranks get the shortest words, as in natural text)."""
    words = set()
    out = []
    while len(out) < count:
        syllables = 1 + min(rng.poisson(0.9), 2)
        word = "".join(
            _ONSETS[rng.integers(len(_ONSETS))]
            + _VOWELS[rng.integers(len(_VOWELS))]
            + _CODAS[rng.integers(len(_CODAS))]
            for _ in range(syllables)
        )
        if word not in words and word != "n":
            words.add(word)
            out.append(word)
    return sorted(out, key=len)


def _build_vocabulary(rng, vocab_size):
    """Returns ``(words, word_class, weights)``: the vocab_size - 1 written word types
    (``<eos>`` is the remaining type, added by the tokenizer), the class of each and its
    Zipf weight."""
    n_types = vocab_size - 1
    fixed = sum(size for _, size in _CLASSES if size is not None)
    if n_types < fixed + 4 * len(_OPEN_SHARE):
        raise ValueError(f"vocab_size must be at least {fixed + 4 * len(_OPEN_SHARE) + 1}")
    pseudo = _make_words(rng, n_types - 2)
    # Class sizes: the closed classes get their fixed numbers, the open ones share the rest.
    open_total = n_types - fixed
    sizes = {}
    for c, (_, size) in enumerate(_CLASSES):
        if size is not None:
            sizes[c] = size
    open_classes = sorted(_OPEN_SHARE)
    for c in open_classes[1:]:
        sizes[c] = int(open_total * _OPEN_SHARE[c])
    sizes[open_classes[0]] = open_total - sum(sizes[c] for c in open_classes[1:])
    # Closed-class words take the shortest pseudo-words; <unk> leads the nouns and N the
    # numbers (both are frequent in PTB).
    words, word_class = [], []
    it = iter(pseudo)
    for c in sorted(sizes, key=lambda c: (_CLASSES[c][1] is None, c)):
        members = []
        if c == 1:
            members.append("<unk>")
        if c == 6:
            members.append("N")
        while len(members) < sizes[c]:
            members.append(next(it))
        words += members
        word_class += [c] * len(members)
    word_class = np.array(word_class)
    # Zipf weights by rank inside each class; a class's total mass comes from the chain.
    weights = np.zeros(n_types)
    for c in sizes:
        idx = np.flatnonzero(word_class == c)
        ranks = np.arange(len(idx))
        w = 1.0 / (ranks + 1.5) ** 1.05
        if c == 1:
            w[0] = w[1] * 3.5  # <unk>: about 5% of all tokens, as in PTB
        if c == 6:
            w[0] = w[1] * 8.0  # N: about 2.5% of all tokens
        weights[idx] = w / w.sum()
    return words, word_class, weights


def _generate(rng, n_words, vocab, successors):
    """Returns a list of sentences (lists of word indices) with exactly n_words words;
    ``successors[w, c]`` is the preferred class-c word after word w."""
    _, word_class, weights = vocab
    n_classes = len(_CLASSES)
    members = [np.flatnonzero(word_class == c) for c in range(n_classes)]
    cum = [np.cumsum(weights[m]) for m in members]
    for c in cum:
        c[-1] = 1.0
    trans_cum = np.cumsum(_TRANSITIONS / _TRANSITIONS.sum(1, keepdims=True), axis=1)
    start_cum = np.cumsum(_START / _START.sum())
    sentences = []
    total = 0
    while total < n_words:
        length = int(max(2, round(rng.gamma(4.0, 21.5 / 4.0))))
        length = min(length, n_words - total)
        u = rng.random((length, 3))
        sentence = []
        prev_word = -1
        cls = int(np.searchsorted(start_cum, u[0, 0], side="right"))
        for t in range(length):
            if t > 0:
                cls = int(np.searchsorted(trans_cum[cls], u[t, 0], side="right"))
            cls = min(cls, n_classes - 1)
            if prev_word >= 0 and u[t, 1] < 0.35:
                word = successors[prev_word, cls]
            else:
                k = int(np.searchsorted(cum[cls], u[t, 2], side="right"))
                word = members[cls][min(k, len(members[cls]) - 1)]
            sentence.append(int(word))
            prev_word = word
        sentences.append(sentence)
        total += length
    return sentences


def write_synthetic_corpus(directory, num_words=200_000, seed=0, vocab_size=10_000):
    """Writes ``train.txt``, ``valid.txt`` and ``test.txt`` (PTB format) into
    ``directory`` (created if needed) and returns the directory path as a string.

    The output depends only on the arguments: all randomness comes from
    ``np.random.default_rng(seed)`` (NumPy's global RNG is not touched). The splits get
    85%, 7.5% and 7.5% of ``num_words`` words (``<eos>`` not counted; each split gets
    at least one word). Sentence lengths follow a gamma distribution with mean about
    21 words (PTB's). The vocabulary depends only on ``seed`` and ``vocab_size``. The
    text uses at most ``vocab_size - 1`` word types (``<unk>`` and ``N`` included), so a
    Corpus built on it has at most ``vocab_size`` entries with ``<eos>``.
    """
    if num_words < 3:
        raise ValueError("num_words must be at least 3")
    rng = np.random.default_rng(seed)
    vocab = _build_vocabulary(rng, vocab_size)
    words, word_class, weights = vocab
    # Each word prefers one fixed successor per class, drawn by the class's Zipf weights.
    n_classes = len(_CLASSES)
    successors = np.zeros((len(words), n_classes), dtype=np.int64)
    for c in range(n_classes):
        idx = np.flatnonzero(word_class == c)
        successors[:, c] = rng.choice(idx, size=len(words), p=weights[idx])
    n_train = int(round(num_words * 0.85))
    n_valid = int(round(num_words * 0.075))
    n_test = num_words - n_train - n_valid
    os.makedirs(directory, exist_ok=True)
    for name, count in (("train.txt", n_train), ("valid.txt", n_valid), ("test.txt", n_test)):
        sentences = _generate(rng, max(count, 1), vocab, successors)
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            for sentence in sentences:
                f.write(" " + " ".join(words[w] for w in sentence) + " \n")
    return os.fspath(directory)
