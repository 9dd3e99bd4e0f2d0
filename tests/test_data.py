"""Tests for needle.data: DataLoader ordering and shuffling, the image transforms, the
NDArray/MNIST/CIFAR-10 datasets on small generated files, the PTB helpers (Dictionary,
Corpus, batchify, get_batch) and the synthetic PTB-format corpus generator."""

import collections
import gzip
import math
import pathlib
import pickle
import re
import struct

import numpy as np
import pytest

import needle as ndl

from devices import DEVICES

PTB_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "ptb"


def test_exported_names():
    for name in (
        "Dataset",
        "DataLoader",
        "Transform",
        "RandomFlipHorizontal",
        "RandomCrop",
        "MNISTDataset",
        "NDArrayDataset",
        "CIFAR10Dataset",
        "Dictionary",
        "Corpus",
        "batchify",
        "get_batch",
        "write_synthetic_corpus",
    ):
        assert hasattr(ndl.data, name), name


# ---------------------------------------------------------------- DataLoader


def _toy_dataset(n=10):
    X = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    y = np.arange(n, dtype=np.int64) % 3
    return X, y, ndl.data.NDArrayDataset(X, y)


def test_ndarray_dataset():
    X, y, ds = _toy_dataset(7)
    assert len(ds) == 7
    item = ds[4]
    assert isinstance(item, tuple) and len(item) == 2
    np.testing.assert_array_equal(item[0], X[4])
    assert item[1] == y[4]


@pytest.mark.parametrize("device", DEVICES)
def test_dataloader_order_without_shuffle(device):
    X, y, ds = _toy_dataset(10)
    loader = ndl.data.DataLoader(ds, batch_size=3, device=device)
    assert len(loader) == 4
    for _ in range(2):  # the order is the same on every pass
        batches = list(loader)
        assert [b[0].shape for b in batches] == [(3, 2, 3)] * 3 + [(1, 2, 3)]
        for k, (xb, yb) in enumerate(batches):
            assert isinstance(xb, ndl.Tensor) and isinstance(yb, ndl.Tensor)
            assert xb.device == device and xb.dtype == "float32" and yb.dtype == "float32"
            np.testing.assert_array_equal(xb.numpy(), X[3 * k : 3 * k + 3])
            np.testing.assert_array_equal(yb.numpy(), y[3 * k : 3 * k + 3].astype(np.float32))


def test_dataloader_default_batch_size_is_one():
    X, y, ds = _toy_dataset(4)
    batches = list(ndl.data.DataLoader(ds))
    assert len(batches) == 4 and batches[2][0].shape == (1, 2, 3)
    np.testing.assert_array_equal(batches[2][0].numpy()[0], X[2])


def test_dataloader_shuffle_matches_seeded_numpy():
    X, y, ds = _toy_dataset(11)
    loader = ndl.data.DataLoader(ds, batch_size=4, shuffle=True)
    np.random.seed(7)
    first = list(loader)
    second = list(loader)
    np.random.seed(7)
    for batches in (first, second):
        perm = np.random.permutation(11)
        order = np.array_split(perm, range(4, 11, 4))
        assert [b[1].shape[0] for b in batches] == [4, 4, 3]
        for idx, (xb, yb) in zip(order, batches):
            np.testing.assert_array_equal(xb.numpy(), X[idx])
            np.testing.assert_array_equal(yb.numpy(), y[idx].astype(np.float32))
    assert not np.array_equal(first[0][0].numpy(), second[0][0].numpy())


# ---------------------------------------------------------------- transforms


def test_random_flip_horizontal_matches_numpy():
    rng = np.random.default_rng(0)
    img = rng.random((5, 4, 3)).astype(np.float32)
    tform = ndl.data.RandomFlipHorizontal(p=0.5)
    flips = 0
    for seed in range(20):
        np.random.seed(seed)
        out = tform(img)
        np.random.seed(seed)
        flip = np.random.rand() < 0.5
        flips += flip
        np.testing.assert_array_equal(out, img[:, ::-1, :] if flip else img)
    assert 0 < flips < 20
    np.testing.assert_array_equal(ndl.data.RandomFlipHorizontal(p=1.0)(img), img[:, ::-1, :])
    np.testing.assert_array_equal(ndl.data.RandomFlipHorizontal(p=0.0)(img), img)


def _shift_reference(img, sx, sy):
    """img shifted so that out[i, j] = img[i + sx, j + sy], zero outside."""
    H, W, _ = img.shape
    out = np.zeros_like(img)
    for i in range(H):
        for j in range(W):
            if 0 <= i + sx < H and 0 <= j + sy < W:
                out[i, j] = img[i + sx, j + sy]
    return out


def test_random_crop_matches_numpy():
    rng = np.random.default_rng(1)
    img = rng.random((6, 5, 2)).astype(np.float32)
    tform = ndl.data.RandomCrop(padding=3)
    for seed in range(15):
        np.random.seed(seed)
        out = tform(img)
        np.random.seed(seed)
        sx, sy = np.random.randint(low=-3, high=4, size=2)
        assert out.shape == img.shape
        np.testing.assert_array_equal(out, _shift_reference(img, sx, sy))
    np.testing.assert_array_equal(ndl.data.RandomCrop(padding=0)(img), img)


def test_dataset_applies_transforms_in_order():
    calls = []

    class Tag(ndl.data.Transform):
        def __init__(self, name):
            self.name = name

        def __call__(self, x):
            calls.append(self.name)
            return x + 1

    ds = ndl.data.Dataset([Tag("a"), Tag("b")])
    assert ds.apply_transforms(np.zeros(2)).tolist() == [2, 2]
    assert calls == ["a", "b"]
    assert ndl.data.Dataset().apply_transforms(5) == 5


# ---------------------------------------------------------------- MNIST


def _write_idx(tmp_path, images, labels, image_magic=2051, label_magic=2049):
    n, rows, cols = images.shape
    img_path = tmp_path / "images-idx3-ubyte.gz"
    lbl_path = tmp_path / "labels-idx1-ubyte.gz"
    with gzip.open(img_path, "wb") as f:
        f.write(struct.pack(">IIII", image_magic, n, rows, cols) + images.tobytes())
    with gzip.open(lbl_path, "wb") as f:
        f.write(struct.pack(">II", label_magic, n) + labels.tobytes())
    return str(img_path), str(lbl_path)


def _mnist_arrays(n=6):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    images[0, 0, 0], images[0, 0, 1] = 0, 255
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    return images, labels


def test_mnist_dataset_reads_idx(tmp_path):
    images, labels = _mnist_arrays()
    ds = ndl.data.MNISTDataset(*_write_idx(tmp_path, images, labels))
    assert len(ds) == 6
    assert ds.images.shape == (6, 784) and ds.images.dtype == np.float32
    assert ds.images.min() == 0.0 and ds.images.max() == 1.0
    np.testing.assert_allclose(ds.images, images.reshape(6, 784) / 255.0, rtol=1e-6)
    img, label = ds[3]
    assert img.shape == (28, 28, 1)
    np.testing.assert_allclose(img[..., 0], images[3] / 255.0, rtol=1e-6)
    assert label == labels[3]


def test_mnist_dataset_transforms_and_loader(tmp_path):
    images, labels = _mnist_arrays()
    paths = _write_idx(tmp_path, images, labels)
    ds = ndl.data.MNISTDataset(*paths, transforms=[ndl.data.RandomFlipHorizontal(p=1.0)])
    img, _ = ds[1]
    np.testing.assert_allclose(img[..., 0], images[1][:, ::-1] / 255.0, rtol=1e-6)
    xb, yb = next(iter(ndl.data.DataLoader(ds, batch_size=4)))
    assert xb.shape == (4, 28, 28, 1) and yb.shape == (4,)
    np.testing.assert_array_equal(yb.numpy(), labels[:4].astype(np.float32))


def test_mnist_dataset_rejects_bad_magic(tmp_path):
    images, labels = _mnist_arrays(2)
    with pytest.raises(ValueError, match="magic"):
        ndl.data.MNISTDataset(*_write_idx(tmp_path, images, labels, image_magic=2049))
    with pytest.raises(ValueError, match="magic"):
        ndl.data.MNISTDataset(*_write_idx(tmp_path, images, labels, label_magic=2051))


def test_mnist_dataset_missing_files_are_named(tmp_path):
    images, labels = _mnist_arrays(2)
    img_path, lbl_path = _write_idx(tmp_path, images, labels)
    missing = str(tmp_path / "nope-labels.gz")
    with pytest.raises(FileNotFoundError, match="MNIST label file not found") as info:
        ndl.data.MNISTDataset(img_path, missing)
    assert info.value.filename == missing
    missing = tmp_path / "nope-images.gz"  # a PathLike works as well as a str
    with pytest.raises(FileNotFoundError, match="MNIST image file not found") as info:
        ndl.data.MNISTDataset(missing, lbl_path)
    assert info.value.filename == str(missing)
    with pytest.raises(FileNotFoundError, match="is a directory"):
        ndl.data.MNISTDataset(str(tmp_path), lbl_path)


def test_mnist_dataset_rejects_a_file_too_short_for_its_header(tmp_path):
    images, labels = _mnist_arrays(2)
    img_path, lbl_path = _write_idx(tmp_path, images, labels)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="too short for an IDX header"):
        ndl.data.MNISTDataset(str(empty), lbl_path)
    empty.write_bytes(b"\0\0\x08")
    with pytest.raises(ValueError, match=r"too short for an IDX header \(3 bytes\)"):
        ndl.data.MNISTDataset(img_path, str(empty))


# ---------------------------------------------------------------- CIFAR-10


def _write_cifar(folder, per_batch=2):
    rng = np.random.default_rng(3)
    raw = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        raw[name] = (data, labels)
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": name.encode()}, f)
    return raw


def test_cifar10_dataset(tmp_path):
    raw = _write_cifar(tmp_path)
    train = ndl.data.CIFAR10Dataset(str(tmp_path), train=True)
    test = ndl.data.CIFAR10Dataset(str(tmp_path), train=False)
    assert len(train) == 10 and len(test) == 2
    assert train.X.shape == (10, 3, 32, 32)
    data = np.concatenate([raw[f"data_batch_{i}"][0] for i in range(1, 6)])
    labels = sum((raw[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    np.testing.assert_allclose(train.X, data.reshape(-1, 3, 32, 32) / 255.0)
    np.testing.assert_array_equal(train.Y, labels)
    img, label = test[1]
    np.testing.assert_allclose(img, raw["test_batch"][0][1].reshape(3, 32, 32) / 255.0)
    assert label == raw["test_batch"][1][1]
    xb, yb = next(iter(ndl.data.DataLoader(train, batch_size=4)))
    assert xb.shape == (4, 3, 32, 32) and yb.shape == (4,)


def test_cifar10_missing_folder(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="CIFAR-10 folder not found") as info:
        ndl.data.CIFAR10Dataset(missing, train=True)
    assert info.value.filename == missing
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="is a file, not a directory"):
        ndl.data.CIFAR10Dataset(str(tmp_path / "a-file"), train=False)


def test_cifar10_missing_batch_file_is_named(tmp_path):
    _write_cifar(tmp_path)
    (tmp_path / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match="CIFAR-10 batch file not found") as info:
        ndl.data.CIFAR10Dataset(tmp_path, train=True)
    assert info.value.filename == str(tmp_path / "data_batch_4")
    assert len(ndl.data.CIFAR10Dataset(tmp_path, train=False)) == 2


@pytest.mark.parametrize(
    "content, cause",
    [
        (b"\x80\x04\x95garbage", pickle.UnpicklingError),  # a damaged pickle
        (b"", EOFError),  # an empty file
        (b"not a pickle at all", pickle.UnpicklingError),
    ],
    ids=["damaged", "empty", "text"],
)
def test_cifar10_corrupt_batch_file_is_named(tmp_path, content, cause):
    _write_cifar(tmp_path)
    bad = tmp_path / "data_batch_3"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=r"data_batch_3: not a CIFAR-10 batch file") as info:
        ndl.data.CIFAR10Dataset(tmp_path, train=True)
    assert str(bad) in str(info.value)
    assert isinstance(info.value.__cause__, cause)  # the original error, chained
    assert len(ndl.data.CIFAR10Dataset(tmp_path, train=False)) == 2


@pytest.mark.parametrize(
    "batch, match",
    [
        ([1, 2, 3], "holds a list, expected a dict"),
        ({b"data": np.zeros((2, 3072), np.uint8)}, "no 'data' or no 'labels'"),
        ({b"data": np.zeros((2, 3000), np.uint8), b"labels": [0, 1]}, r"shape \(2, 3000\)"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1, 2]}, r"labels of shape \(3,\)"),
    ],
    ids=["list", "no-labels", "short-rows", "label-count"],
)
def test_cifar10_batch_of_the_wrong_form_is_named(tmp_path, batch, match):
    _write_cifar(tmp_path)
    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump(batch, f)
    with pytest.raises(ValueError, match=match) as info:
        ndl.data.CIFAR10Dataset(tmp_path, train=False)
    assert str(tmp_path / "test_batch") in str(info.value)


# ---------------------------------------------------------------- PTB helpers


def test_dictionary():
    d = ndl.data.Dictionary()
    assert len(d) == 0
    assert [d.add_word(w) for w in ["the", "cat", "the", "<eos>"]] == [0, 1, 0, 2]
    assert len(d) == 3
    assert d.word2idx == {"the": 0, "cat": 1, "<eos>": 2}
    assert d.idx2word == ["the", "cat", "<eos>"]


def _write(path, text):
    path.write_text(text, encoding="utf-8")


def test_corpus_vocabulary_and_ids(tmp_path):
    _write(tmp_path / "train.txt", " a b c \n b c d \n a \n")
    _write(tmp_path / "test.txt", " d e \n")
    _write(tmp_path / "valid.txt", " zzz \n")  # never read
    corpus = ndl.data.Corpus(tmp_path)
    assert corpus.dictionary.idx2word == ["a", "b", "c", "<eos>", "d", "e"]
    assert corpus.train == [0, 1, 2, 3, 1, 2, 4, 3, 0, 3]
    assert corpus.test == [4, 5, 3]
    assert len(corpus.dictionary) == 6
    short = ndl.data.Corpus(str(tmp_path), max_lines=1)
    assert short.train == [0, 1, 2, 3]
    assert short.test == [4, 5, 3]


def test_corpus_upstream_names_and_valid_fallback(tmp_path):
    _write(tmp_path / "ptb.valid.txt", " x y \n")
    _write(tmp_path / "ptb.test.txt", " y z \n")
    corpus = ndl.data.Corpus(tmp_path)
    assert corpus.train_path.endswith("ptb.valid.txt")
    assert corpus.dictionary.idx2word == ["x", "y", "<eos>", "z"]
    _write(tmp_path / "ptb.train.txt", " t \n")
    assert ndl.data.Corpus(tmp_path).train_path.endswith("ptb.train.txt")
    _write(tmp_path / "train.txt", " u \n")
    _write(tmp_path / "test.txt", " v \n")
    corpus = ndl.data.Corpus(tmp_path)
    assert corpus.train_path.endswith("train.txt") and corpus.test_path.endswith("test.txt")
    assert corpus.dictionary.idx2word == ["u", "<eos>", "v"]


def test_corpus_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="PTB corpus directory not found") as info:
        ndl.data.Corpus(tmp_path / "missing")
    assert info.value.filename == str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="training"):
        ndl.data.Corpus(tmp_path)
    _write(tmp_path / "train.txt", " a \n")
    with pytest.raises(FileNotFoundError, match="test"):
        ndl.data.Corpus(tmp_path)


@pytest.mark.parametrize(
    "max_lines, exc", [(-1, ValueError), (True, TypeError), (1.5, TypeError), ("2", TypeError)]
)
def test_corpus_rejects_a_bad_max_lines(tmp_path, max_lines, exc):
    _write(tmp_path / "train.txt", " a \n")
    _write(tmp_path / "test.txt", " b \n")
    with pytest.raises(exc, match="max_lines"):
        ndl.data.Corpus(tmp_path, max_lines=max_lines)
    assert ndl.data.Corpus(tmp_path, max_lines=0).train == []


def test_batchify_layout():
    data = list(range(23))
    batches = ndl.data.batchify(data, 4, device=None, dtype="float32")
    assert isinstance(batches, np.ndarray)
    assert batches.shape == (5, 4) and batches.dtype == np.float32
    for j in range(4):
        np.testing.assert_array_equal(batches[:, j], np.arange(5 * j, 5 * j + 5))


@pytest.mark.parametrize("device", DEVICES)
def test_get_batch_shapes_and_last_chunk(device):
    batches = ndl.data.batchify(list(range(40)), 4, device=device, dtype="float32")  # (10, 4)
    data, target = ndl.data.get_batch(batches, 0, 3, device=device, dtype="float32")
    assert data.shape == (3, 4) and target.shape == (12,)
    assert data.device == device and target.device == device
    np.testing.assert_array_equal(data.numpy(), batches[0:3])
    np.testing.assert_array_equal(target.numpy(), batches[1:4].reshape(-1))
    # Last chunk: only nbatch - i - 1 rows are left.
    data, target = ndl.data.get_batch(batches, 7, 5, device=device, dtype="float32")
    assert data.shape == (2, 4) and target.shape == (8,)
    np.testing.assert_array_equal(data.numpy(), batches[7:9])
    np.testing.assert_array_equal(target.numpy(), batches[8:10].reshape(-1))
    # Walking the stream in steps of bptt covers every row but the last.
    starts = range(0, batches.shape[0] - 1, 4)
    assert [ndl.data.get_batch(batches, i, 4)[0].shape[0] for i in starts] == [4, 4, 1]
    with pytest.raises(ValueError):
        ndl.data.get_batch(batches, 9, 5)


# ---------------------------------------------------------------- synthetic corpus

_TOKEN = re.compile(r"^([a-z]+|<unk>|N)$")


def test_synthetic_corpus_is_deterministic(tmp_path):
    state = np.random.get_state()
    a = ndl.data.write_synthetic_corpus(tmp_path / "a", num_words=20_000, seed=3)
    ndl.data.write_synthetic_corpus(str(tmp_path / "b"), num_words=20_000, seed=3)
    ndl.data.write_synthetic_corpus(tmp_path / "c", num_words=20_000, seed=4)
    assert str(a) == str(tmp_path / "a")
    after = np.random.get_state()
    assert after[0] == state[0] and np.array_equal(after[1], state[1]) and after[2:] == state[2:]
    for name in ("train.txt", "valid.txt", "test.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()


def test_synthetic_corpus_format_and_statistics(tmp_path):
    directory = ndl.data.write_synthetic_corpus(tmp_path, num_words=200_000, seed=0)
    counts = {}
    lengths = []
    for name in ("train.txt", "valid.txt", "test.txt"):
        lines = (pathlib.Path(directory) / name).read_text(encoding="utf-8").splitlines()
        words = [w for line in lines for w in line.split()]
        assert all(_TOKEN.match(w) for w in words)
        assert all(line.split() for line in lines)
        counts[name] = len(words)
        lengths += [len(line.split()) for line in lines]
    assert sum(counts.values()) == 200_000
    assert counts["train.txt"] == 170_000
    assert counts["valid.txt"] == counts["test.txt"] == 15_000
    assert 18 <= np.mean(lengths) <= 24

    corpus = ndl.data.Corpus(directory)
    vocab = corpus.dictionary
    assert len(vocab) <= 10_000
    assert "<unk>" in vocab.word2idx and "N" in vocab.word2idx and "<eos>" in vocab.word2idx
    freq = collections.Counter(corpus.train)
    n = len(corpus.train)
    assert 0.02 < freq[vocab.word2idx["<unk>"]] / n < 0.08
    # Zipf-like: the most frequent word is far more frequent than the 100th.
    ranked = sorted(freq.values(), reverse=True)
    assert ranked[0] > 20 * ranked[99]
    # Local structure: a smoothed bigram model beats the unigram model on the test text.
    V = len(vocab)
    bigram = collections.Counter(zip(corpus.train[:-1], corpus.train[1:]))

    def unigram(w):
        return (freq[w] + 0.1) / (n + 0.1 * V)

    test = corpus.test
    h_uni = -np.mean([math.log(unigram(w)) for w in test])
    h_bi = -np.mean(
        [
            math.log(0.6 * bigram[(p, w)] / freq[p] + 0.4 * unigram(w) if freq[p] else unigram(w))
            for p, w in zip(test[:-1], test[1:])
        ]
    )
    assert h_bi < h_uni - 0.3, (h_bi, h_uni)


def test_synthetic_corpus_vocabulary_bound(tmp_path):
    ndl.data.write_synthetic_corpus(tmp_path, num_words=30_000, seed=1, vocab_size=200)
    corpus = ndl.data.Corpus(tmp_path)
    assert len(corpus.dictionary) <= 200


# ---------------------------------------------------------------- real PTB text


def test_corpus_on_real_ptb():
    if not (PTB_DIR / "ptb.valid.txt").is_file() or not (PTB_DIR / "ptb.test.txt").is_file():
        pytest.skip(reason=f"real PTB valid/test text not found at {PTB_DIR}")
    corpus = ndl.data.Corpus(PTB_DIR)
    assert corpus.train_path.endswith("ptb.valid.txt")
    assert corpus.test_path.endswith("ptb.test.txt")
    # ptb.valid.txt has 6022 distinct tokens with <eos>, ptb.test.txt 6049; together 7596.
    assert len(corpus.dictionary) == 7596
    assert len(corpus.train) == 73_760
    assert len(corpus.test) == 82_430
    batches = ndl.data.batchify(corpus.train, 20, device=None, dtype="float32")
    assert batches.shape == (73_760 // 20, 20)
