/* cuda_lstm.cu: the fused LSTM step kernels of the CUDA backend
 * (nd_lstm_step_desc and nd_lstm_step_grad_desc in internal.h): one launch
 * for a step's gates forward, one for their gradient backward; csrc/lstm.c
 * runs the GEMMs around them.
 *
 * One thread per (row, hidden unit) cell, in grid-stride loops: the four
 * gates of a cell sit H apart in a (B, 4H) row, so neighbouring threads read
 * neighbouring columns of each gate (coalesced). The activations are the
 * elementwise kernels' (nd_cuda_sigmoid, tanhf). Default stream; no memory is
 * allocated here.
 */
#include "cuda_common.cuh"

/* d: (B, 4H) pre-activation parts in, (B, H) states and (B, 5H) saved out. */
__global__ void lstm_step_kernel(nd_lstm_step_desc d) {
    const int64_t H = d.hidden, G = 4 * H, cells = d.batch * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < cells;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / H, j = e - r * H;
        float pre[4];
        ND_UNROLL
        for (int k = 0; k < 4; k++) {
            /* ((x @ w_ih + h @ w_hh) + b_ih) + b_hh: the unfused cell's order */
            float v = d.xw[r * G + k * H + j];
            if (d.hw != NULL) v += d.hw[r * G + k * H + j];
            if (d.b_ih != NULL) {
                v += d.b_ih[k * H + j];
                v += d.b_hh[k * H + j];
            }
            pre[k] = v;
        }
        const float i = nd_cuda_sigmoid(pre[0]), f = nd_cuda_sigmoid(pre[1]);
        const float g = tanhf(pre[2]), o = nd_cuda_sigmoid(pre[3]);
        const float c_prev = d.c != NULL ? d.c[e] : 0.0f;
        const float c_new = f * c_prev + i * g;
        const float tc = tanhf(c_new);
        const float h = o * tc;
        d.c_out[e] = c_new;
        d.h_out[e] = h;
        if (d.h_copy != NULL) d.h_copy[e] = h;
        float *s = d.saved + r * 5 * H + j;
        s[0] = i;
        s[H] = f;
        s[2 * H] = g;
        s[3 * H] = o;
        s[4 * H] = tc;
    }
}

/* d: (B, 5H) saved and (B, H) state gradients in, (B, 4H) gate gradients
 * and (B, H) dc_prev out (dc_prev may be dc: read, then written, by one
 * thread). */
__global__ void lstm_step_grad_kernel(nd_lstm_step_grad_desc d) {
    const int64_t H = d.hidden, G = 4 * H, cells = d.batch * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < cells;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / H, j = e - r * H;
        const float *s = d.saved + r * 5 * H + j;
        const float i = s[0], f = s[H], g = s[2 * H], o = s[3 * H], tc = s[4 * H];
        float dh = d.dh != NULL ? d.dh[e] : 0.0f;
        if (d.dh2 != NULL) dh += d.dh2[e];
        const float dc = d.dc != NULL ? d.dc[e] : 0.0f;
        const float c = d.c != NULL ? d.c[e] : 0.0f;
        const float dct = dc + dh * o * (1.0f - tc * tc);
        float *dg = d.dgates + r * G + j;
        dg[0] = dct * g * i * (1.0f - i);
        dg[H] = dct * c * f * (1.0f - f);
        dg[2 * H] = dct * i * (1.0f - g * g);
        dg[3 * H] = dh * tc * o * (1.0f - o);
        if (d.dc_prev != NULL) d.dc_prev[e] = dct * f;
    }
}

nd_status nd_cuda_lstm_step(const nd_lstm_step_desc *d) {
    const int64_t cells = d->batch * d->hidden;
    if (cells == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(d->h_out, NULL));
    cudaStream_t stream = nd_cuda_stream();
    ND_LAUNCH(lstm_step_kernel, nd_cuda_blocks(cells, ND_CUDA_THREADS), ND_CUDA_THREADS, 0, stream,
              *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}

nd_status nd_cuda_lstm_step_grad(const nd_lstm_step_grad_desc *d) {
    const int64_t cells = d->batch * d->hidden;
    if (cells == 0) return ND_OK;
    ND_TRY(nd_cuda_activate(d->dgates, NULL));
    cudaStream_t stream = nd_cuda_stream();
    ND_LAUNCH(lstm_step_grad_kernel, nd_cuda_blocks(cells, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              stream, *d);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
