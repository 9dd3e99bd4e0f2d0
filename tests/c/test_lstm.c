/* test_lstm.c: unit tests of the engine's LSTM layer (csrc/lstm.c,
 * cpu_lstm.c) through the engine's headers: the forward against a double
 * precision reference, what the Python ops never pass (no initial state,
 * no h_n wanted, a y that does not hold the saved values, parts of the
 * gradient not wanted), and every error path leaving the allocator's books
 * as they were. Built and run by tests/test_engine_c.py; prints failures,
 * exits nonzero. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { T = 3, B = 2, IN = 3, H = 5, G = 4 * H };

/* max |a - b| over two arrays of one shape (inf when they cannot be read) */
static double max_diff(const nd_array *a, const nd_array *b) {
    int64_t n = nd_layout_numel(&a->layout);
    if (n != nd_layout_numel(&b->layout)) return INFINITY;
    float *x = host_copy(a), *y = host_copy(b);
    double worst = x && y ? 0.0 : INFINITY;
    for (int64_t i = 0; x && y && i < n; i++)
        worst = fmax(worst, fabs((double)x[i] - (double)y[i]));
    free(x);
    free(y);
    return worst;
}

static float values[T * B * IN + IN * G + H * G + 2 * G + 2 * B * H];

static float wave(int i, double scale) { return (float)(scale * sin(0.37 * i + 0.11 * i * i)); }

typedef struct inputs {
    nd_array x, w_ih, w_hh, b_ih, b_hh, h0, c0;
} inputs;

static inputs make_inputs(nd_device *dev) {
    for (int i = 0; i < (int)(sizeof values / sizeof values[0]); i++) values[i] = wave(i, 0.8);
    const float *v = values;
    inputs in;
    in.x = make(dev, 3, (int64_t[]){T, B, IN}, v);
    in.w_ih = make(dev, 2, (int64_t[]){IN, G}, v += T * B * IN);
    in.w_hh = make(dev, 2, (int64_t[]){H, G}, v += IN * G);
    in.b_ih = make(dev, 1, (int64_t[]){G}, v += H * G);
    in.b_hh = make(dev, 1, (int64_t[]){G}, v += G);
    in.h0 = make(dev, 2, (int64_t[]){B, H}, v += G);
    in.c0 = make(dev, 2, (int64_t[]){B, H}, v += B * H);
    return in;
}

static void release_inputs(inputs *in) {
    nd_array *all[7] = {&in->x, &in->w_ih, &in->w_hh, &in->b_ih, &in->b_hh, &in->h0, &in->c0};
    for (int i = 0; i < 7; i++) nd_array_release(all[i]);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* The layer in double from the host values (h0, c0 NULL: zeros). */
static void reference(const float *h0, const float *c0, double *y, double *c_last) {
    const float *x = values, *w_ih = x + T * B * IN, *w_hh = w_ih + IN * G;
    const float *b_ih = w_hh + H * G, *b_hh = b_ih + G;
    double h[B * H], c[B * H];
    for (int e = 0; e < B * H; e++) {
        h[e] = h0 ? h0[e] : 0.0;
        c[e] = c0 ? c0[e] : 0.0;
    }
    for (int t = 0; t < T; t++) {
        double next_h[B * H];
        for (int r = 0; r < B; r++)
            for (int j = 0; j < H; j++) {
                double pre[4];
                for (int k = 0; k < 4; k++) {
                    int col = k * H + j;
                    double s = (double)b_ih[col] + (double)b_hh[col];
                    for (int p = 0; p < IN; p++)
                        s += (double)x[(t * B + r) * IN + p] * (double)w_ih[p * G + col];
                    for (int p = 0; p < H; p++) s += h[r * H + p] * (double)w_hh[p * G + col];
                    pre[k] = s;
                }
                double cn = sigmoid(pre[1]) * c[r * H + j] + sigmoid(pre[0]) * tanh(pre[2]);
                c[r * H + j] = cn;
                next_h[r * H + j] = sigmoid(pre[3]) * tanh(cn);
            }
        for (int e = 0; e < B * H; e++) y[t * B * H + e] = h[e] = next_h[e];
    }
    for (int e = 0; e < B * H; e++) c_last[e] = c[e];
}

static void test_forward_against_double(int with_state) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    inputs in = make_inputs(cpu);
    const float *h0 = values + T * B * IN + IN * G + H * G + 2 * G, *c0 = h0 + B * H;
    nd_array y, h_n, c_n;
    CHECK(nd_array_lstm(&in.x, with_state ? &in.h0 : NULL, with_state ? &in.c0 : NULL, &in.w_ih,
                        &in.w_hh, &in.b_ih, &in.b_hh, &y, &h_n, &c_n) == ND_OK);
    double want_y[T * B * H], want_c[B * H];
    reference(with_state ? h0 : NULL, with_state ? c0 : NULL, want_y, want_c);
    float *got_y = host_copy(&y), *got_h = host_copy(&h_n), *got_c = host_copy(&c_n);
    CHECK(got_y && got_h && got_c);
    CHECK(y.layout.ndim == 3 && y.layout.shape[0] == T && y.layout.shape[2] == H);
    for (int e = 0; got_y && got_h && got_c && e < T * B * H; e++) {
        CHECK(fabs(got_y[e] - want_y[e]) < 2e-6);
        if (e >= (T - 1) * B * H) {
            CHECK(got_h[e - (T - 1) * B * H] == got_y[e]); /* h_n is the last step's h */
            CHECK(fabs(got_c[e - (T - 1) * B * H] - want_c[e - (T - 1) * B * H]) < 2e-6);
        }
    }
    free(got_y);
    free(got_h);
    free(got_c);
    nd_array_release(&y);
    nd_array_release(&h_n);
    nd_array_release(&c_n);
    release_inputs(&in);
    CHECK(allocated(cpu) == base);
}

/* No initial state (h0 = c0 = NULL, no GEMM at step 0, W_hh's gradient from
 * h_1..h_{T-1} only) gives what zero arrays give, forward and backward; the
 * backward from y = NULL (the forward run again) gives the same bits as from
 * the forward's y; h_n may be left out. */
static void test_no_state_and_recompute(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    inputs in = make_inputs(cpu);
    nd_array zero_h = make(cpu, 2, (int64_t[]){B, H}, NULL);
    nd_array zero_c = make(cpu, 2, (int64_t[]){B, H}, NULL);
    nd_array dy = make(cpu, 3, (int64_t[]){T, B, H}, values + 7);
    nd_array dc = make(cpu, 2, (int64_t[]){B, H}, values + 3);
    nd_array y0, c0n, y1, h1n, c1n;
    CHECK(nd_array_lstm(&in.x, NULL, NULL, &in.w_ih, &in.w_hh, &in.b_ih, &in.b_hh, &y0, NULL,
                        &c0n) == ND_OK);
    CHECK(nd_array_lstm(&in.x, &zero_h, &zero_c, &in.w_ih, &in.w_hh, &in.b_ih, &in.b_hh, &y1, &h1n,
                        &c1n) == ND_OK);
    CHECK(max_diff(&y0, &y1) == 0.0 && max_diff(&c0n, &c1n) == 0.0);
    int all = ND_LSTM_GRAD_X | ND_LSTM_GRAD_STATE | ND_LSTM_GRAD_BIAS;
    nd_lstm_grads g0, g1, again;
    CHECK(nd_array_lstm_backward(&in.x, NULL, NULL, &in.w_ih, &in.w_hh, &in.b_ih, &in.b_hh, &y0,
                                 &dy, NULL, &dc, all, &g0) == ND_OK);
    CHECK(nd_array_lstm_backward(&in.x, &zero_h, &zero_c, &in.w_ih, &in.w_hh, &in.b_ih, &in.b_hh,
                                 &y1, &dy, NULL, &dc, all, &g1) == ND_OK);
    CHECK(nd_array_lstm_backward(&in.x, &zero_h, &zero_c, &in.w_ih, &in.w_hh, &in.b_ih, &in.b_hh,
                                 NULL, &dy, NULL, &dc, all, &again) == ND_OK);
    nd_array *a[6] = {&g0.x, &g0.h0, &g0.c0, &g0.w_ih, &g0.w_hh, &g0.bias};
    nd_array *b[6] = {&g1.x, &g1.h0, &g1.c0, &g1.w_ih, &g1.w_hh, &g1.bias};
    nd_array *c[6] = {&again.x, &again.h0, &again.c0, &again.w_ih, &again.w_hh, &again.bias};
    for (int i = 0; i < 6; i++) {
        CHECK(max_diff(a[i], b[i]) <= 1e-6);
        CHECK(max_diff(b[i], c[i]) == 0.0);
    }
    /* the two bias rows are equal and are the column sums of the gates' gradient */
    float *bias = host_copy(&g1.bias);
    for (int j = 0; bias && j < G; j++) CHECK(bias[j] == bias[G + j]);
    free(bias);
    nd_lstm_grads_release(&g0);
    nd_lstm_grads_release(&g1);
    nd_lstm_grads_release(&again);
    /* only the weights asked for: the other entries stay empty */
    nd_lstm_grads w;
    CHECK(nd_array_lstm_backward(&in.x, &zero_h, &zero_c, &in.w_ih, &in.w_hh, NULL, NULL, &y1, NULL,
                                 NULL, &dc, 0, &w) == ND_OK);
    CHECK(w.x.storage == NULL && w.h0.storage == NULL && w.bias.storage == NULL);
    CHECK(w.w_ih.storage != NULL && w.w_hh.storage != NULL);
    nd_lstm_grads_release(&w);
    nd_array *all_arrays[9] = {&zero_h, &zero_c, &dy, &dc, &y0, &c0n, &y1, &h1n, &c1n};
    for (int i = 0; i < 9; i++) nd_array_release(all_arrays[i]);
    release_inputs(&in);
    CHECK(allocated(cpu) == base);
}

static void test_errors(void) {
    nd_device *cpu = nd_device_at(0), *other = nd_host_device_register("lstm_other");
    CHECK(other != NULL);
    inputs in = make_inputs(cpu);
    int64_t base = allocated(cpu);
    nd_array y, c_n, bad2d = make(cpu, 2, (int64_t[]){B, IN}, values);
    nd_array w_bad = make(cpu, 2, (int64_t[]){IN, G + 1}, values);
    nd_array h_bad = make(cpu, 2, (int64_t[]){B + 1, H}, values);
    nd_array x_empty = make(cpu, 3, (int64_t[]){0, B, IN}, values);
    nd_array x_other = make(other, 3, (int64_t[]){T, B, IN}, values);
    base = allocated(cpu);
    CHECK(nd_array_lstm(&bad2d, NULL, NULL, &in.w_ih, &in.w_hh, NULL, NULL, &y, NULL, &c_n) ==
          ND_ERR_SHAPE);
    CHECK(nd_array_lstm(&in.x, NULL, NULL, &w_bad, &in.w_hh, NULL, NULL, &y, NULL, &c_n) ==
          ND_ERR_SHAPE);
    CHECK(nd_array_lstm(&in.x, NULL, NULL, &in.w_ih, &in.w_ih, NULL, NULL, &y, NULL, &c_n) ==
          ND_ERR_SHAPE);
    CHECK(nd_array_lstm(&in.x, &h_bad, NULL, &in.w_ih, &in.w_hh, NULL, NULL, &y, NULL, &c_n) ==
          ND_ERR_SHAPE);
    CHECK(nd_array_lstm(&in.x, NULL, NULL, &in.w_ih, &in.w_hh, &in.b_ih, NULL, &y, NULL, &c_n) ==
          ND_ERR_VALUE);
    CHECK(nd_array_lstm(&in.x, NULL, NULL, &in.w_ih, &in.w_hh, &in.h0, &in.b_hh, &y, NULL, &c_n) ==
          ND_ERR_SHAPE);
    CHECK(nd_array_lstm(&x_empty, NULL, NULL, &in.w_ih, &in.w_hh, NULL, NULL, &y, NULL, &c_n) ==
          ND_ERR_SHAPE);
    CHECK(nd_array_lstm(&x_other, NULL, NULL, &in.w_ih, &in.w_hh, NULL, NULL, &y, NULL, &c_n) ==
          ND_ERR_DEVICE);
    CHECK(y.storage == NULL && c_n.storage == NULL);
    nd_lstm_grads g;
    CHECK(nd_array_lstm_backward(&in.x, NULL, NULL, &in.w_ih, &in.w_hh, NULL, NULL, NULL, &h_bad,
                                 NULL, NULL, 0, &g) == ND_ERR_SHAPE);
    CHECK(nd_array_lstm_backward(&in.x, NULL, NULL, &in.w_ih, &in.w_hh, NULL, NULL, NULL, NULL,
                                 &h_bad, NULL, 0, &g) == ND_ERR_SHAPE);
    CHECK(g.w_ih.storage == NULL && g.w_hh.storage == NULL);
    CHECK(allocated(cpu) == base);
    nd_array *made[5] = {&bad2d, &w_bad, &h_bad, &x_empty, &x_other};
    for (int i = 0; i < 5; i++) nd_array_release(made[i]);
    release_inputs(&in);
}

int main(void) {
    test_forward_against_double(0);
    test_forward_against_double(1);
    test_no_state_and_recompute();
    test_errors();
    if (failures > 0) printf("%d check(s) failed\n", failures);
    return failures > 0;
}
