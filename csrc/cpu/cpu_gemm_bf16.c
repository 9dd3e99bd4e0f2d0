/* cpu_gemm_bf16.c: the bfloat16 micro-kernel of the CPU's narrow matmul
 * (cpu_matmul_typed.c) on CPUs with AMX: TDPBF16PS multiplies a 16 x 32
 * tile of bfloat16 A by a 32 x 16 tile of B into 16 x 16 float32 sums, 8192
 * multiply-adds an instruction, with no widening of the operands.
 *
 * Why AMX and not AVX512-BF16: on the Xeon this was written on (both
 * present), VDPBF16PS ran needle's 8 x 32 kernel at 136 GFLOP/s against 212
 * for the float32 FMA kernel on widened operands (bench/gemm_dtype_bench.py,
 * 1024^3, 2 cores), so a CPU with AVX512-BF16 and no AMX widens.
 *
 * The operands come packed in pairs along the inner dimension (one 32-bit
 * word holds A(i, 2q) in its low half and A(i, 2q+1) in its high half, B's
 * likewise), which is AMX's own layout for B; the inner dimension is padded
 * with zeros to 16 pairs, a tile's row. Tiles need the kernel's permission
 * (Linux's arch_prctl, asked once per process) and a tile configuration in
 * each thread that runs the kernel (its begin/end). The kernel is handed
 * out only where the CPU has AMX-BF16, the OS grants the tiles, and the ISA
 * in force is AVX-512 (NEEDLE_CPU_ISA below it turns it off).
 * TDPBF16PS treats subnormal inputs as zero and rounds to nearest even,
 * whatever MXCSR says: a bfloat16 product's tolerance is far coarser.
 */
#define _DEFAULT_SOURCE /* syscall: hidden by -std=c11 */
#include "cpu_gemm.h"

#include <string.h>

#if defined(ND_GEMM_X86) && defined(__linux__)
#define ND_GEMM_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ATTR target("amx-tile,amx-bf16,avx512f")
enum { MR_AMX = 32, NR_AMX = 32, PAIRS_AMX = 16 };
/* Linux's arch_prctl codes (asm/prctl.h) and the tile data's feature bit. */
enum { ARCH_GET_XCOMP_PERM_ = 0x1022, ARCH_REQ_XCOMP_PERM_ = 0x1023, XFEATURE_XTILEDATA_ = 18 };

/* The tile configuration (palette 1): tiles 0-3 the 2 x 2 blocks of sums,
 * 4-5 A's two 16-row halves, 6-7 B's two 16-column halves; 16 rows of 64
 * bytes each. */
typedef struct tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* In static storage, whole: GCC's _tile_loadconfig tells the compiler it
 * reads only the first 8 bytes, so a configuration built on the stack can
 * lose the stores to the rest (the load then faults). */
static const tile_config amx_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

__attribute__((AMX_ATTR)) static void amx_begin(void) { _tile_loadconfig(&amx_config); }

__attribute__((AMX_ATTR)) static void amx_end(void) { _tile_release(); }

/* The mr x nr tile of C: whole 32 x 32 tiles are loaded and stored in
 * place, edge tiles through a local 32 x 32 copy (the tiles always move 32
 * rows and columns; the packed operands have them, the output may not). */
__attribute__((AMX_ATTR)) static void ukernel_amx(int64_t kpairs, const uint32_t *a, int64_t a_rs,
                                                  const uint32_t *b, float *c, int64_t ldc, int mr,
                                                  int nr, int accumulate) {
    float edge[MR_AMX * NR_AMX] __attribute__((aligned(64)));
    const int whole = mr == MR_AMX && nr == NR_AMX;
    float *t = whole ? c : edge;
    const int64_t ldt = whole ? ldc : NR_AMX;
    if (accumulate) {
        if (!whole) {
            memset(edge, 0, sizeof edge);
            for (int i = 0; i < mr; i++)
                memcpy(edge + i * NR_AMX, c + i * ldc, sizeof(float) * (size_t)nr);
        }
        _tile_loadd(0, t, ldt * 4);
        _tile_loadd(1, t + 16, ldt * 4);
        _tile_loadd(2, t + 16 * ldt, ldt * 4);
        _tile_loadd(3, t + 16 * ldt + 16, ldt * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t q = 0; q < kpairs; q += PAIRS_AMX) {
        _tile_loadd(4, a + q, a_rs * 4);
        _tile_loadd(5, a + 16 * a_rs + q, a_rs * 4);
        _tile_loadd(6, b + q * NR_AMX, NR_AMX * 4);
        _tile_loadd(7, b + q * NR_AMX + 16, NR_AMX * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, t, ldt * 4);
    _tile_stored(1, t + 16, ldt * 4);
    _tile_stored(2, t + 16 * ldt, ldt * 4);
    _tile_stored(3, t + 16 * ldt + 16, ldt * 4);
    if (!whole)
        for (int i = 0; i < mr; i++)
            memcpy(c + i * ldc, edge + i * NR_AMX, sizeof(float) * (size_t)nr);
}

static const nd_gemm_pair_ukernel ukernel_amx_bf16 = {
    "amx-bf16 32x32", MR_AMX, NR_AMX, PAIRS_AMX, ukernel_amx, amx_begin, amx_end,
};

/* Whether the CPU has AMX-BF16 and Linux lets this process use the tiles
 * (asked once; 1 yes, 0 no, -1 not asked yet). */
static atomic_int amx_usable = -1;

static int amx_granted(void) {
    int state = atomic_load(&amx_usable);
    if (state >= 0) return state;
    unsigned eax, ebx, ecx, edx;
    int ok = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 22)) /* AMX-BF16 */
             && (edx & (1u << 24)) /* AMX-TILE */;
    if (ok) {
        unsigned long mask = 0;
        ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) == 0 &&
             syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM_, &mask) == 0 &&
             (mask & (1ul << XFEATURE_XTILEDATA_));
    }
    atomic_store(&amx_usable, ok ? 1 : 0);
    return ok ? 1 : 0;
}
#endif

const nd_gemm_pair_ukernel *nd_cpu_gemm_bf16_ukernel(void) {
#ifdef ND_GEMM_AMX
    if (nd_cpu_isa_current() == ND_CPU_ISA_AVX512 && amx_granted()) return &ukernel_amx_bf16;
#endif
    return NULL;
}

/* ------------------------------------------------------------- packing */

static inline uint32_t pair_of(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}

void nd_cpu_pack_bf16_pairs_a(uint32_t *dst, const uint16_t *a, int64_t a_rs, int64_t a_cs,
                              int64_t rows, int64_t kc, int64_t row_pairs) {
    const int64_t pairs = kc / 2;
    for (int64_t i = 0; i < rows; i++) {
        const uint16_t *row = a + i * a_rs;
        uint32_t *out = dst + i * row_pairs;
        if (a_cs == 1) {
            /* The row's pairs are already adjacent: a copy (little-endian). */
            memcpy(out, row, (size_t)pairs * sizeof(uint32_t));
        } else {
            for (int64_t q = 0; q < pairs; q++)
                out[q] = pair_of(row[2 * q * a_cs], row[(2 * q + 1) * a_cs]);
        }
        int64_t q = pairs;
        if (kc % 2) out[q++] = pair_of(row[(kc - 1) * a_cs], 0);
        for (; q < row_pairs; q++) out[q] = 0;
    }
}

void nd_cpu_pack_bf16_pairs_b(uint32_t *dst, const uint16_t *b, int64_t b_rs, int64_t b_cs,
                              int64_t kc, int64_t cols, int nr, int64_t row_pairs) {
    for (int64_t q = 0; q < row_pairs; q++) {
        uint32_t *out = dst + q * nr;
        if (2 * q >= kc) {
            memset(out, 0, sizeof(uint32_t) * (size_t)nr);
            continue;
        }
        const uint16_t *r0 = b + 2 * q * b_rs;
        if (2 * q + 1 == kc)
            for (int64_t j = 0; j < cols; j++) out[j] = pair_of(r0[j * b_cs], 0);
        else if (b_cs == 1)
            for (int64_t j = 0; j < cols; j++) out[j] = pair_of(r0[j], r0[b_rs + j]);
        else
            for (int64_t j = 0; j < cols; j++) out[j] = pair_of(r0[j * b_cs], r0[b_rs + j * b_cs]);
    }
}
