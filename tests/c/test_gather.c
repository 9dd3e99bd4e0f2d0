/* test_gather.c: unit tests of row indexing (nd_array_gather_rows and the
 * scatter-add family) through the engine's public header: values checked by
 * hand, strided inputs, repeated indices, and every error path leaving the
 * allocator's books as they were.
 * Built and run by tests/test_engine_c.py; prints failures, exits nonzero. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

static int equals(const nd_array *a, const float *expected, int64_t n) {
    float host[64];
    if (n > 64 || nd_layout_numel(&a->layout) != n) return 0;
    if (nd_array_to_host(a, host) != ND_OK) return 0;
    for (int64_t i = 0; i < n; i++)
        if (host[i] != expected[i]) return 0;
    return 1;
}

/* table (4, 3): row r is r*10 + (0, 1, 2). */
static nd_array make_table(nd_device *dev) {
    float v[12];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++) v[r * 3 + c] = (float)(r * 10 + c);
    return make(dev, 2, (int64_t[]){4, 3}, v);
}

static void test_gather(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_array table = make_table(cpu);
    nd_array idx = make(cpu, 2, (int64_t[]){2, 2}, (float[]){3, 0, 1, 3});
    nd_array out;
    CHECK(nd_array_gather_rows(&table, &idx, &out) == ND_OK);
    CHECK(out.layout.ndim == 3 && out.layout.shape[0] == 2 && out.layout.shape[1] == 2 &&
          out.layout.shape[2] == 3 && nd_layout_is_contiguous(&out.layout));
    CHECK(equals(&out, (float[]){30, 31, 32, 0, 1, 2, 10, 11, 12, 30, 31, 32}, 12));
    nd_array_release(&out);

    /* Strided table (a column slice) and strided, transposed indices. */
    nd_array cols = table;
    nd_layout_slice(&cols.layout, 1, 2, -2, 2); /* columns 2, 0 */
    nd_array idx_t = idx;
    CHECK(nd_layout_permute(&idx.layout, (int[]){1, 0}, &idx_t.layout) ==
          ND_OK); /* [[3,1],[0,3]] */
    CHECK(nd_array_gather_rows(&cols, &idx_t, &out) == ND_OK);
    CHECK(equals(&out, (float[]){32, 30, 12, 10, 2, 0, 32, 30}, 8));
    nd_array_release(&out);

    /* A 0-d index gives one row; an empty index array gives no rows. */
    nd_array one = make(cpu, 0, NULL, (float[]){2});
    CHECK(nd_array_gather_rows(&table, &one, &out) == ND_OK);
    CHECK(out.layout.ndim == 1 && equals(&out, (float[]){20, 21, 22}, 3));
    nd_array_release(&out);
    nd_array none;
    CHECK(nd_array_empty(cpu, 1, (int64_t[]){0}, &none) == ND_OK);
    CHECK(nd_array_gather_rows(&table, &none, &out) == ND_OK);
    CHECK(out.layout.ndim == 2 && out.layout.shape[0] == 0 && out.layout.shape[1] == 3);
    nd_array_release(&out);
    nd_array_release(&none);
    nd_array_release(&one);
    nd_array_release(&idx);
    nd_array_release(&table);
    CHECK(allocated(cpu) == base);
}

static void test_gather_errors(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    nd_array table = make_table(cpu), out;
    static const float bad[][2] = {{0, 4}, {-1, 0}, {1.5f, 0}, {NAN, 0}, {INFINITY, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nd_array idx = make(cpu, 1, (int64_t[]){2}, bad[i]);
        CHECK(nd_array_gather_rows(&table, &idx, &out) == ND_ERR_INDEX);
        CHECK(out.storage == NULL);
        nd_array_release(&idx);
    }
    /* The table must be 2-D. */
    nd_array flat = table;
    CHECK(nd_layout_reshape(&table.layout, 1, (int64_t[]){12}, &flat.layout) == ND_OK);
    nd_array idx = make(cpu, 1, (int64_t[]){1}, (float[]){0});
    CHECK(nd_array_gather_rows(&flat, &idx, &out) == ND_ERR_SHAPE);
    /* Arrays on two devices. */
    nd_array other = make(nd_host_device_register("cpu_numpy"), 1, (int64_t[]){1}, (float[]){0});
    CHECK(nd_array_gather_rows(&table, &other, &out) == ND_ERR_DEVICE);
    nd_array_release(&other);
    nd_array_release(&idx);
    nd_array_release(&table);
    CHECK(allocated(cpu) == base);
}

static void test_scatter(void) {
    nd_device *cpu = nd_device_at(0);
    int64_t base = allocated(cpu);
    /* src (3, 2) into 4 rows; row 1 is hit twice and accumulates. */
    nd_array src = make(cpu, 2, (int64_t[]){3, 2}, (float[]){1, 2, 3, 4, 5, 6});
    nd_array idx = make(cpu, 1, (int64_t[]){3}, (float[]){1, 3, 1});
    nd_array out;
    CHECK(nd_array_scatter_add_rows(&src, &idx, 4, &out) == ND_OK);
    CHECK(out.layout.ndim == 2 && out.layout.shape[0] == 4 && out.layout.shape[1] == 2);
    CHECK(equals(&out, (float[]){0, 0, 6, 8, 0, 0, 3, 4}, 8));

    /* In place into a strided destination (columns reversed) adds on top. */
    nd_array rev = out;
    nd_layout_slice(&rev.layout, 1, 1, -1, 2);
    CHECK(nd_array_scatter_add_rows_into(&rev, &src, &idx) == ND_OK);
    CHECK(equals(&out, (float[]){0, 0, 14, 14, 0, 0, 7, 7}, 8));
    /* A bad index fails before any row is written. */
    nd_array bad = make(cpu, 1, (int64_t[]){3}, (float[]){0, 2, 4});
    CHECK(nd_array_scatter_add_rows_into(&out, &src, &bad) == ND_ERR_INDEX);
    CHECK(equals(&out, (float[]){0, 0, 14, 14, 0, 0, 7, 7}, 8));
    nd_array_release(&bad);

    /* A source that shares the destination's storage is read before any
     * write: rows 1..2 of out added at rows 2 and 1 (row 2 is written before
     * it is read as the source's second row). */
    nd_array head = out;
    nd_layout_slice(&head.layout, 0, 1, 1, 2);
    nd_array swap = make(cpu, 1, (int64_t[]){2}, (float[]){2, 1});
    CHECK(nd_array_scatter_add_rows_into(&out, &head, &swap) == ND_OK);
    CHECK(equals(&out, (float[]){0, 0, 14, 14, 14, 14, 7, 7}, 8));
    nd_array_release(&swap);
    nd_array_release(&out);

    /* Shape errors: source not indices.shape + (d,), negative row count. */
    nd_array src_t = src;
    CHECK(nd_layout_permute(&src.layout, (int[]){1, 0}, &src_t.layout) == ND_OK);
    CHECK(nd_array_scatter_add_rows(&src_t, &idx, 4, &out) == ND_ERR_SHAPE);
    CHECK(nd_array_scatter_add_rows(&src, &idx, -1, &out) == ND_ERR_VALUE);
    CHECK(nd_array_scatter_add_rows(&src, &idx, 2, &out) == ND_ERR_INDEX);
    CHECK(out.storage == NULL);
    /* Zero rows and no indices is an empty table. */
    nd_array none_idx, none_src;
    CHECK(nd_array_empty(cpu, 1, (int64_t[]){0}, &none_idx) == ND_OK);
    CHECK(nd_array_empty(cpu, 2, (int64_t[]){0, 2}, &none_src) == ND_OK);
    CHECK(nd_array_scatter_add_rows(&none_src, &none_idx, 0, &out) == ND_OK);
    CHECK(out.layout.shape[0] == 0 && out.layout.shape[1] == 2);
    nd_array_release(&out);
    nd_array_release(&none_src);
    nd_array_release(&none_idx);
    nd_array_release(&idx);
    nd_array_release(&src);
    CHECK(allocated(cpu) == base);
}

/* scatter_add_rows is gather_rows' adjoint: <gather(T, i), G> == <T, scatter(G, i)>. */
static void test_adjoint(void) {
    nd_device *cpu = nd_device_at(0);
    nd_array table = make_table(cpu);
    float iv[5] = {2, 0, 2, 3, 2}, gv[15];
    for (int i = 0; i < 15; i++) gv[i] = (float)(i % 7) - 3.0f;
    nd_array idx = make(cpu, 1, (int64_t[]){5}, iv), g = make(cpu, 2, (int64_t[]){5, 3}, gv);
    nd_array gathered, scattered;
    CHECK(nd_array_gather_rows(&table, &idx, &gathered) == ND_OK);
    CHECK(nd_array_scatter_add_rows(&g, &idx, 4, &scattered) == ND_OK);
    float a[15], t[12], s[12];
    double lhs = 0.0, rhs = 0.0;
    if (gathered.storage != NULL && scattered.storage != NULL) {
        nd_array_to_host(&gathered, a);
        nd_array_to_host(&table, t);
        nd_array_to_host(&scattered, s);
        for (int i = 0; i < 15; i++) lhs += (double)a[i] * gv[i];
        for (int i = 0; i < 12; i++) rhs += (double)t[i] * s[i];
    }
    CHECK(fabs(lhs - rhs) < 1e-6 && lhs != 0.0);
    nd_array_release(&gathered);
    nd_array_release(&scattered);
    nd_array_release(&g);
    nd_array_release(&idx);
    nd_array_release(&table);
}

int main(void) {
    test_gather();
    test_gather_errors();
    test_scatter();
    test_adjoint();
    if (failures) {
        printf("%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_gather: all checks passed\n");
    return 0;
}
