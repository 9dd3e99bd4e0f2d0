/* cuda_arch.h: whether a GPU can run the code a build of the CUDA backend
 * embeds, decided from the architecture lists setup.py records at build time
 * (NEEDLE_CUDA_SASS, NEEDLE_CUDA_PTX), before any kernel is launched.
 *
 * Plain C with no CUDA in it, so that it is compiled into every build and the
 * decision is tested without a GPU (needle_c._cuda_arch_check). The CUDA
 * backend asks it at device discovery (cuda_backend.cu): a GPU it says no to
 * is not registered, and its answer becomes ndl.cuda.unavailable_reason().
 */
#ifndef NEEDLE_CUDA_ARCH_H
#define NEEDLE_CUDA_ARCH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Can a GPU of compute capability major.minor run a build that embeds machine
 * code (SASS) for each architecture of `sass` and PTX for `ptx`?
 *
 * `sass`: architectures separated by spaces, as setup.py's NEEDLE_CUDA_ARCH
 * spells them ("75 80 86 89 90", "90a", "100f"); `ptx`: one of them, or ""
 * when no PTX is embedded. The rules are CUDA's: SASS for X.y runs on X.z
 * with z >= y (an "a" variant only on X.y itself); PTX for X.y is compiled by
 * the driver for any GPU of X.y or newer (an "a" variant only X.y, an "f"
 * variant only X.z with z >= y). `toolkit_major` (CUDART_VERSION / 1000) only
 * words the advice: CUDA 13 cannot compile for GPUs older than sm_75.
 *
 * Returns 1 (usable; why is ""), 0 (not usable; why says so and what to
 * rebuild with) or -1 (a list is malformed; why says which). */
int nd_cuda_arch_check(const char *sass, const char *ptx, int toolkit_major, int major, int minor,
                       char *why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif /* NEEDLE_CUDA_ARCH_H */
