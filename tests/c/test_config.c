/* test_config.c: unit tests of the engine's readers of NEEDLE_* variables
 * (csrc/config.c): the count and choice parsers, table-driven, each value set
 * in the environment and read back; a bad value's message names the variable,
 * the value and the table's ACCEPTS; blanks around a value are ignored and a
 * blank one is unset; the table's rows are well formed. The thread count the
 * CPU kernels default to comes from the same parser. Built and run by
 * tests/test_engine_c.py; prints failures, exits nonzero. */
#define _DEFAULT_SOURCE /* setenv, unsetenv: hidden by -std=c11 */

#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

typedef struct count_case {
    nd_config_var var;
    const char *text; /* NULL: unset */
    int want;         /* 1 set, 0 unset, -1 refused */
    int64_t value;
} count_case;

static const count_case count_cases[] = {
    {ND_CFG_NUM_THREADS, NULL, 0, 0},
    {ND_CFG_NUM_THREADS, "", 0, 0},
    {ND_CFG_NUM_THREADS, "  ", 0, 0},
    {ND_CFG_NUM_THREADS, "3", 1, 3},
    {ND_CFG_NUM_THREADS, " 3 ", 1, 3},
    {ND_CFG_NUM_THREADS, "007", 1, 7},
    {ND_CFG_NUM_THREADS, "1", 1, 1},
    {ND_CFG_NUM_THREADS, "256", 1, 256},
    {ND_CFG_NUM_THREADS, "0", -1, 0},
    {ND_CFG_NUM_THREADS, "257", -1, 0},
    {ND_CFG_NUM_THREADS, "-2", -1, 0},
    {ND_CFG_NUM_THREADS, "+3", -1, 0},
    {ND_CFG_NUM_THREADS, "0x10", -1, 0},
    {ND_CFG_NUM_THREADS, "2.5", -1, 0},
    {ND_CFG_NUM_THREADS, "3 4", -1, 0},
    {ND_CFG_NUM_THREADS, "many", -1, 0},
    {ND_CFG_GEMM_SPLIT, "0", 1, 0},
    {ND_CFG_GEMM_SPLIT, "9223372036854775807", 1, INT64_MAX},
    {ND_CFG_GEMM_SPLIT, "9223372036854775808", -1, 0},
    {ND_CFG_GEMM_SPLIT, "99999999999999999999999", -1, 0},
    {ND_CFG_GEMM_SPLIT, "-1", -1, 0},
    {ND_CFG_GEMM_SPLIT, "1e6", -1, 0},
};

typedef struct choice_case {
    nd_config_var var;
    const char *text;
    int want;
    int index;
} choice_case;

static const choice_case choice_cases[] = {
    {ND_CFG_BLAS, NULL, 0, 0},
    {ND_CFG_BLAS, "0", 1, 0},
    {ND_CFG_BLAS, " 1\t", 1, 1},
    {ND_CFG_BLAS, "2", -1, 0},
    {ND_CFG_BLAS, "01", -1, 0},
    {ND_CFG_BLAS, "yes", -1, 0},
    {ND_CFG_CPU_ISA, "avx512", 1, 0},
    {ND_CFG_CPU_ISA, "avx2", 1, 1},
    {ND_CFG_CPU_ISA, "baseline", 1, 2},
    {ND_CFG_CPU_ISA, "AVX2", -1, 0},
    {ND_CFG_CPU_ISA, "avx", -1, 0},
    {ND_CFG_CPU_ISA, "avx5120", -1, 0},
    {ND_CFG_RNG, "auto", 1, 0},
    {ND_CFG_RNG, "host", 1, 1},
    {ND_CFG_RNG, "device", 1, 2},
    {ND_CFG_RNG, "gpu", -1, 0},
    {ND_CFG_RNG, "", 0, 0},
};

static void set(nd_config_var var, const char *text) {
    const char *name = nd_config_row_of(var)->name;
    if (text == NULL) unsetenv(name);
    else setenv(name, text, 1);
}

/* The message of a refusal: "NEEDLE_X='text': expected <ACCEPTS>". */
static int names_it(nd_config_var var, const char *text) {
    const nd_config_row *row = nd_config_row_of(var);
    char want[512];
    snprintf(want, sizeof want, "%s='%s': expected %s", row->name, text, row->accepts);
    return strcmp(nd_last_error(), want) == 0;
}

static void test_counts(void) {
    for (size_t i = 0; i < sizeof count_cases / sizeof count_cases[0]; i++) {
        const count_case *c = &count_cases[i];
        set(c->var, c->text);
        int64_t value = -12345;
        int got = nd_config_count(c->var, &value);
        if (got != c->want)
            printf("case %zu: '%s' gave %d\n", i, c->text ? c->text : "(unset)", got);
        CHECK(got == c->want);
        CHECK(got == 1 ? value == c->value : value == -12345);
        if (got < 0) CHECK(names_it(c->var, c->text));
        set(c->var, NULL);
    }
}

static void test_choices(void) {
    for (size_t i = 0; i < sizeof choice_cases / sizeof choice_cases[0]; i++) {
        const choice_case *c = &choice_cases[i];
        set(c->var, c->text);
        int index = -7;
        int got = nd_config_choice(c->var, &index);
        if (got != c->want)
            printf("case %zu: '%s' gave %d\n", i, c->text ? c->text : "(unset)", got);
        CHECK(got == c->want);
        CHECK(got == 1 ? index == c->index : index == -7);
        if (got < 0) CHECK(names_it(c->var, c->text));
        set(c->var, NULL);
    }
}

/* A value longer than the reader's buffer is refused by name, not cut. */
static void test_text(void) {
    char buf[8];
    setenv("NEEDLE_CUBLAS", "  /lib/x.so ", 1);
    CHECK(nd_config_text(ND_CFG_CUBLAS, buf, sizeof buf) == -1);
    CHECK(strstr(nd_last_error(), "NEEDLE_CUBLAS='/lib/x.so") != NULL);
    setenv("NEEDLE_CUBLAS", " 0 ", 1);
    CHECK(nd_config_text(ND_CFG_CUBLAS, buf, sizeof buf) == 1 && strcmp(buf, "0") == 0);
    unsetenv("NEEDLE_CUBLAS");
    CHECK(nd_config_text(ND_CFG_CUBLAS, buf, sizeof buf) == 0 && buf[0] == '\0');
}

static void test_rows(void) {
    for (int v = 0; v < ND_CFG_VAR_COUNT; v++) {
        const nd_config_row *r = nd_config_row_of((nd_config_var)v);
        CHECK(strncmp(r->name, "NEEDLE_", 7) == 0);
        CHECK(r->accepts[0] != '\0' && r->doc[0] != '\0' && r->default_text[0] != '\0');
        CHECK((r->kind == ND_CFG_CHOICE) == (r->choices[0] != '\0'));
        CHECK(r->kind == ND_CFG_COUNT ? r->lo <= r->hi : r->lo == 0 && r->hi == 0);
        CHECK(strcmp(nd_config_kind_name(r->kind), "?") != 0);
        CHECK(strcmp(nd_config_section_name(r->section), "?") != 0);
        for (int w = 0; w < v; w++)
            CHECK(strcmp(nd_config_row_of((nd_config_var)w)->name, r->name) != 0);
    }
}

/* The CPU kernels' default thread count is NEEDLE_NUM_THREADS through the same parser. */
static void test_default_threads(void) {
    setenv("NEEDLE_NUM_THREADS", " 5 ", 1);
    nd_cpu_set_threads(0); /* back to the default, read anew */
    CHECK(nd_cpu_get_threads() == 5);
    unsetenv("NEEDLE_NUM_THREADS");
    nd_cpu_set_threads(0);
    CHECK(nd_cpu_get_threads() >= 1);
}

int main(void) {
    test_counts();
    test_choices();
    test_text();
    test_rows();
    test_default_threads();
    if (failures) printf("%d failure(s)\n", failures);
    return failures != 0;
}
