/* config.h: the one table of needle's NEEDLE_* environment variables, and
 * the engine's readers of them.
 *
 * ND_CONFIG_VARS is the list every layer reads: the engine and needle_c
 * read their variables through nd_config_* below, needle_c exports the
 * table to Python (needle_c._config_table()), python/needle/_environ.py
 * reads and reports every variable through it (an unlisted name is a bug
 * there), and tests/test_config_table.py checks README.md's environment
 * table and every NEEDLE_* name the sources read against it. Adding a
 * variable is one row here, its reader, and its README row.
 *
 * A row: X(ID, SECTION, KIND, LO, HI, CHOICES, DEFAULT, ACCEPTS, DOC)
 *   ID       the name after NEEDLE_ (enum ND_CFG_<ID>)
 *   SECTION  who reads it: ND_CFG_RUN (needle, at import or at the first
 *            CUDA call), ND_CFG_BUILD (setup.py, which runs before any of
 *            this is compiled and parses them itself), ND_CFG_TEST (the test
 *            suite and bench/gpu_validate.sh, never needle)
 *   KIND     the kind of value, each with one parser: nd_config_count and
 *            nd_config_choice here, the others in Python (_environ.py's
 *            switch, needle.memory.parse_size, the readers of the lists) or,
 *            for the simulator's switches, in csrc/cuda/sim/sim_runtime.cc
 *   LO, HI   the accepted range of a count
 *   CHOICES  the accepted words of a choice, separated by '|'
 *   DEFAULT  what an unset or empty variable means (README's "Default")
 *   ACCEPTS  what a bad value's error says is expected (README's "Accepts")
 *   DOC      what it does, one line (README's "What it does")
 *
 * An empty or blank value is the default, as an unset one is; surrounding
 * blanks are ignored. A bad value of a run-time variable is a ValueError at
 * import: "NEEDLE_X='text': expected <ACCEPTS>".
 *
 * The engine part (nd_config_*) never calls Python; it reads getenv only.
 */
#ifndef NEEDLE_CONFIG_H
#define NEEDLE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ND_CONFIG_VARS(X)                                                                          \
    /* ------------------------------------------------ read by needle: memory */                  \
    X(MEMORY_LIMIT, ND_CFG_RUN, ND_CFG_LIST, 0, 0, "", "no limit",                                 \
      "a size for every device such as 2GiB, 4096 (bytes), 0.5 or 50% (of each device's "          \
      "capacity), or sizes per device such as cpu=1GiB,cuda=0.5, each device named once",          \
      "device memory limits at import; a unit-less decimal outside (0, 1], such as 1.5, is "       \
      "refused; a cuda limit where no GPU can be used warns that it applies to nothing")           \
    X(ALLOC_CONF, ND_CFG_RUN, ND_CFG_LIST, 0, 0, "", "PyTorch's defaults",                         \
      "comma-separated [cpu:|cuda:]option:value items, each option once per device kind; "         \
      "options: max_split_size_mb (an integer above 20, or None), garbage_collection_threshold "   \
      "(a number in (0, 1), or None), expandable_segments (True or False)",                        \
      "the caching allocators' settings at import (see Allocator settings), as "                   \
      "set_allocator_settings takes them")                                                         \
    X(GC, ND_CFG_RUN, ND_CFG_SWITCH, 0, 0, "", "1", "one of 1/true/on/yes or 0/false/off/no",      \
      "0 switches pressure and out-of-memory collections off (the course's behaviour)")            \
    X(GC_GROWTH, ND_CFG_RUN, ND_CFG_NUMBER, 0, 0, "", "0.25", "a finite number >= 0, e.g. 1.0",    \
      "the collection policy's growth: collect past survivors times (1 + growth)")                 \
    X(GC_MIN_GROWTH, ND_CFG_RUN, ND_CFG_SIZE, 0, 0, "", "64MiB",                                   \
      "a size such as 64MiB or 67108864 (bytes)",                                                  \
      "the collection policy's least growth: collect past survivors + min_growth at least")        \
    X(GC_HIGH_WATER, ND_CFG_RUN, ND_CFG_NUMBER, 0, 0, "", "0.8",                                   \
      "a fraction of the budget in (0, 1], e.g. 0.9",                                              \
      "the collection policy's cap on its trigger, as a share of the device's budget")             \
    X(GC_MAX_FRACTION, ND_CFG_RUN, ND_CFG_NUMBER, 0, 0, "", "0.05",                                \
      "a share of wall time in (0, 0.5], e.g. 0.05",                                               \
      "the collector's share of wall time that pressure collections keep to")                      \
    X(GC_WATERMARK, ND_CFG_RUN, ND_CFG_SIZE, 0, 0, "", "the computed trigger",                     \
      "a size above 0 such as 1.5GiB or a fraction of each device's budget such as 50% or 0.5",    \
      "a fixed watermark that replaces the computed trigger: collect when allocations pass it")    \
    X(OOM_SNAPSHOT, ND_CFG_RUN, ND_CFG_PATH, 0, 0, "", "none (no snapshot)",                       \
      "a file path whose directory exists and is writable",                                        \
      "at an out-of-memory error, write the device's memory snapshot (PyTorch's format, with the " \
      "history when it is recorded) to this file before raising (ndl.memory.set_oom_snapshot)")    \
    /* ------------------------------------------ read by needle: distributed */                   \
    X(DIST_TIMEOUT, ND_CFG_RUN, ND_CFG_NUMBER, 0, 0, "", "300", "a number of seconds > 0",         \
      "seconds a needle.distributed collective waits for the other ranks before raising "          \
      "DistributedError (init_process_group(timeout=) overrides)")                                 \
    X(DIST_CUDA_AWARE, ND_CFG_RUN, ND_CFG_SWITCH, 0, 0, "", "ask the MPI library",                 \
      "one of 1/true/on/yes or 0/false/off/no",                                                    \
      "1: hand CUDA device memory to MPI directly; 0: stage it through host memory")               \
    X(NCCL, ND_CFG_RUN, ND_CFG_LIBRARY, 0, 0, "",                                                  \
      "the nvidia-nccl-cu13 wheel, then the loader's path",                                        \
      "the path or soname of a libnccl.so.2",                                                      \
      "the libnccl.so.2 that init_process_group(backend=\"nccl\") loads")                          \
    /* ------------------------------------------- read by needle: the course */                   \
    X(GRAPH_MODE, ND_CFG_RUN, ND_CFG_CHOICE, 0, 0, "cycle_free|needle", "cycle_free",              \
      "cycle_free or needle",                                                                      \
      "the autograd's graph mode at import: needle keeps the course's graphs (a .grad that "       \
      "can be differentiated, a cycle through every .grad); at run time "                          \
      "ndl.autograd.set_graph_mode")                                                               \
    X(BACKEND, ND_CFG_RUN, ND_CFG_CHOICE, 0, 0, "nd|np", "nd", "nd or np",                         \
      "the course's backend switch: np gives a Tensor made from data without a dtype NumPy's "     \
      "dtype, so Python floats, lists and integers become float64 as in the course's "             \
      "NumPy-backed hw1 and hw2; nd makes them float32 (hw3 on)")                                  \
    /* ------------------------------------------------ read by needle: the CPU */                 \
    X(BLAS, ND_CFG_RUN, ND_CFG_CHOICE, 0, 0, "0|1", "1",                                           \
      "0 (needle's own GEMM) or 1 (a BLAS when one is found, the default)",                        \
      "0: needle's own GEMM instead of NumPy's OpenBLAS")                                          \
    X(CPU_ISA, ND_CFG_RUN, ND_CFG_CHOICE, 0, 0, "avx512|avx2|baseline", "the best the CPU runs",   \
      "avx512, avx2 or baseline",                                                                  \
      "the CPU kernels' instruction set; one the CPU lacks is refused with a warning")             \
    X(GEMM_SPLIT, ND_CFG_RUN, ND_CFG_COUNT, 0, INT64_MAX, "", "measured",                          \
      "a count of multiply-adds (m times n times k), an integer >= 0",                             \
      "the size from which a matmul goes to the BLAS (measured at the first product that could "   \
      "go either way)")                                                                            \
    X(RNG, ND_CFG_RUN, ND_CFG_CHOICE, 0, 0, "auto|host|device", "auto",                            \
      "auto (the device generator on CUDA devices, NumPy's draws on the CPU), host (NumPy's "      \
      "draws copied to every device: the course's values) or device (the device generator "        \
      "everywhere)",                                                                               \
      "where rand/randn/randb (so init.* and nn.Dropout) draw; at run time "                       \
      "ndl.random.set_rng_mode")                                                                   \
    X(NUM_THREADS, ND_CFG_RUN, ND_CFG_COUNT, 1, 256, "", "the online processors",                  \
      "a thread count from 1 to 256",                                                              \
      "threads the CPU's row kernels (softmax cross-entropy, log-softmax, log-sum-exp) split "     \
      "large arrays over")                                                                         \
    /* ------------------------------------------------- read by needle: CUDA */                   \
    X(CUBLAS, ND_CFG_RUN, ND_CFG_LIBRARY, 0, 0, "", "1",                                           \
      "0 (needle's own SGEMM kernel), 1 (find cuBLAS, the default), or the path or soname of a "   \
      "libcublas",                                                                                 \
      "which GEMM CUDA matmuls use; a path must name a file")                                      \
    X(SIM_MEMORY, ND_CFG_RUN, ND_CFG_SIZE, 0, 0, "", "4GiB",                                       \
      "a byte count such as 536870912 or 512MiB",                                                  \
      "the CUDA simulator's device memory (NEEDLE_CUDA=sim builds)")                               \
    X(SIM_MAX_BLOCKS, ND_CFG_RUN, ND_CFG_COUNT, 0, INT64_MAX, "", "0",                             \
      "a block count (0: no cap)",                                                                 \
      "the CUDA simulator runs every grid with at most this many blocks (NEEDLE_CUDA=sim builds)") \
    X(SIM_PERTURB, ND_CFG_RUN, ND_CFG_CHOICE, 0, 0, "0|1", "0", "0 or 1",                          \
      "1: the CUDA simulator reorders warps around barriers, so that a missing barrier shows "     \
      "(NEEDLE_CUDA=sim builds)")                                                                  \
    X(SIM_COMPUTE_CAPABILITY, ND_CFG_RUN, ND_CFG_CAPABILITY, 0, 0, "", "9.0",                      \
      "major.minor such as 7.0 or 9.0",                                                            \
      "the compute capability the CUDA simulator's GPU reports, so that device discovery meets "   \
      "an older or newer GPU than the build's (NEEDLE_CUDA=sim builds)")                           \
    X(SIM_VMM, ND_CFG_RUN, ND_CFG_CHOICE, 0, 0, "0|1", "1", "0 or 1",                              \
      "0: the CUDA simulator's GPU has no virtual memory management (NEEDLE_CUDA=sim builds)")     \
    /* ------------------------------------------------------ read by setup.py */                  \
    X(CUDA, ND_CFG_BUILD, ND_CFG_CHOICE, 0, 0, "auto|0|1|sim", "auto", "auto, 0, 1 or sim",        \
      "auto: build the CUDA backend when nvcc is found; 1: required; 0: skip; sim: the backend "   \
      "on needle's CUDA simulator")                                                                \
    X(CUDA_ARCH, ND_CFG_BUILD, ND_CFG_LIST, 0, 0, "",                                              \
      "sm_70 to sm_90 (CUDA 12) or sm_75 to sm_90 (CUDA 13), plus PTX of the highest",             \
      "compute capabilities such as 80;90 or 9.0",                                                 \
      "the GPU architectures to build for; one the toolkit cannot compile stops the build")        \
    X(STRICT, ND_CFG_BUILD, ND_CFG_CHOICE, 0, 0, "0|1", "0", "1 (on) or 0 (off)",                  \
      "1: compiler warnings are errors")                                                           \
    X(DEBUG, ND_CFG_BUILD, ND_CFG_CHOICE, 0, 0, "0|1", "0", "1 (on) or 0 (off)", "1: -O0 -g")      \
    X(SANITIZE, ND_CFG_BUILD, ND_CFG_CHOICE, 0, 0, "0|1", "0", "1 (on) or 0 (off)",                \
      "1: AddressSanitizer and UBSan (and no CUDA)")                                               \
    /* ------------------------------------------- read by the tests and bench */                  \
    X(REQUIRE_CUDA, ND_CFG_TEST, ND_CFG_CHOICE, 0, 0, "0|1", "0", "1 or 0",                        \
      "1: tests marked cuda fail, with ndl.cuda.unavailable_reason(), instead of skipping")        \
    X(FUZZ_PROGRAMS, ND_CFG_TEST, ND_CFG_COUNT, 0, INT64_MAX, "", "300", "a whole number >= 0",    \
      "how many programs tests/fuzz runs")                                                         \
    X(FUZZ_SEED, ND_CFG_TEST, ND_CFG_COUNT, 0, INT64_MAX, "", "0", "a whole number >= 0",          \
      "the first program (seed) tests/fuzz runs")                                                  \
    X(VALIDATE_SUITE, ND_CFG_TEST, ND_CFG_LIST, 0, 0, "", "the tests marked cuda",                 \
      "all, or pytest arguments", "what bench/gpu_validate.sh's suite step runs")                  \
    X(NCCL_STUB_LOG, ND_CFG_TEST, ND_CFG_PATH, 0, 0, "", "none (the stub records nothing)",        \
      "a file path", "where tests/distributed/nccl_stub.c appends each NCCL call it receives")

/* Who reads a variable (the table's SECTION). */
typedef enum nd_config_section { ND_CFG_RUN, ND_CFG_BUILD, ND_CFG_TEST } nd_config_section;

/* The kinds of value (the table's KIND); nd_config_kind_name gives the
 * name Python sees. */
typedef enum nd_config_kind {
    ND_CFG_COUNT,      /* an integer in [LO, HI]: nd_config_count */
    ND_CFG_CHOICE,     /* one of CHOICES, exactly: nd_config_choice */
    ND_CFG_SWITCH,     /* 1/true/on/yes or 0/false/off/no, any case: _environ.switch */
    ND_CFG_NUMBER,     /* a real number: its Python reader, with the range in ACCEPTS */
    ND_CFG_SIZE,       /* bytes with an optional unit: needle.memory.parse_size, the simulator */
    ND_CFG_LIBRARY,    /* the path or soname of a shared library: dlopen'd by its reader */
    ND_CFG_CAPABILITY, /* <major>.<minor>: the simulator */
    ND_CFG_LIST,       /* comma- or space-separated items with their own grammar */
    ND_CFG_PATH        /* a file's path */
} nd_config_kind;

typedef enum nd_config_var {
#define ND_CONFIG_ENUM(id, section, kind, lo, hi, choices, deflt, accepts, doc) ND_CFG_##id,
    ND_CONFIG_VARS(ND_CONFIG_ENUM)
#undef ND_CONFIG_ENUM
        ND_CFG_VAR_COUNT
} nd_config_var;

/* One row of the table. */
typedef struct nd_config_row {
    const char *name; /* "NEEDLE_..." */
    nd_config_section section;
    nd_config_kind kind;
    int64_t lo, hi;
    const char *choices, *default_text, *accepts, *doc;
} nd_config_row;

/* The row of v (v < ND_CFG_VAR_COUNT). */
const nd_config_row *nd_config_row_of(nd_config_var v);
const char *nd_config_kind_name(nd_config_kind kind);
const char *nd_config_section_name(nd_config_section section);

/* Copies v's value, blanks around it removed, into buf: 1 when it is set,
 * 0 when it is unset or blank (buf holds ""), -1 when it does not fit in
 * size bytes (nd_last_error says which variable). */
int nd_config_text(nd_config_var v, char *buf, size_t size);

/* Parses v as a count (a decimal integer in [LO, HI]): 1 with *out set, 0
 * when unset (*out untouched), -1 for a bad value, with nd_last_error()
 * "NEEDLE_X='text': expected <ACCEPTS>". */
int nd_config_count(nd_config_var v, int64_t *out);

/* Parses v as a choice: 1 with *index set to the word's place in CHOICES,
 * 0 when unset, -1 for a bad value (the message as for a count). */
int nd_config_choice(nd_config_var v, int *index);

#ifdef __cplusplus
}
#endif

#endif /* NEEDLE_CONFIG_H */
