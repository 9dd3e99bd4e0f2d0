/* ewise_ops.h: the one list of needle's elementwise ops, each with its scalar
 * formula, made into the op enums here and expanded by both backends
 * into their kernels (cpu_loops.inc: the CPU loops and their table;
 * cuda/cuda_ewise.cu: the functors and the dispatch switch). An op is added
 * here, once; a backend never writes a formula of its own.
 *
 * C11 and CUDA C++ alike: macros and a static inline function, nothing else.
 *
 * A list is an X-macro: ND_EWISE_BINARY_OPS(X, A) calls X(A, id, name,
 * formula) once per op, in enum order; A is passed through untouched (a
 * backend passes the storage type it expands for; the enums below, nothing).
 * A formula is one expression of the compute-type operands x (and y): the
 * type the storage type computes in (float for float32). It writes its
 * constants as float literals (exact in every compute type) and its
 * functions as the ND_EW_* macros below, which the expanding backend defines
 * for its compute types before it expands a list:
 *   ND_EW_LOG(x) ND_EW_EXP(x) ND_EW_TANH(x) ND_EW_SQRT(x) ND_EW_SIGMOID(x)
 *   ND_EW_ABS(x) ND_EW_POW(x, y)
 * (the CPU's are cpu_math.h's vectorizable versions, CUDA's the device
 * library's), so the two backends agree on everything but the last ulps of
 * the transcendental functions.
 *
 * A storage type (dtype) is added once per backend: its compute type and
 * conversions (cpu_loops.inc: ND_COMPUTE_T, ND_LOAD_T, ND_STORE_T;
 * cuda_ewise.cu: ewise_type<T>), then one expansion of every op for it
 * (ND_CPU_EWISE_LOOPS(T) and its table entries; binary_op<T>, unary_op<T>).
 */
#ifndef NEEDLE_EWISE_OPS_H
#define NEEDLE_EWISE_OPS_H

/* The lists are laid out by hand: clang-format reads x * y as a declaration. */
/* clang-format off */

/* x op y, for arrays and scalars alike. Comparisons give 1.0 or 0.0; NaN
 * propagates from either side of maximum/minimum, as in NumPy. */
#define ND_EWISE_BINARY_OPS(X, A)                         \
    X(A, ND_ADD, add, x + y)                              \
    X(A, ND_SUB, sub, x - y)                              \
    X(A, ND_MUL, mul, x * y)                              \
    X(A, ND_DIV, div, x / y)                              \
    X(A, ND_POW, pow, ND_EW_POW(x, y))                    \
    X(A, ND_MAXIMUM, maximum, (x >= y || x != x) ? x : y) \
    X(A, ND_MINIMUM, minimum, (x <= y || x != x) ? x : y) \
    X(A, ND_EQ, eq, x == y ? 1.0f : 0.0f)                 \
    X(A, ND_NE, ne, x != y ? 1.0f : 0.0f)                 \
    X(A, ND_GE, ge, x >= y ? 1.0f : 0.0f)                 \
    X(A, ND_GT, gt, x > y ? 1.0f : 0.0f)                  \
    X(A, ND_LE, le, x <= y ? 1.0f : 0.0f)                 \
    X(A, ND_LT, lt, x < y ? 1.0f : 0.0f)

/* op x. relu keeps NaN, as NumPy's maximum(x, 0) does. */
#define ND_EWISE_UNARY_OPS(X, A)                \
    X(A, ND_NEG, neg, -x)                       \
    X(A, ND_LOG, log, ND_EW_LOG(x))             \
    X(A, ND_EXP, exp, ND_EW_EXP(x))             \
    X(A, ND_TANH, tanh, ND_EW_TANH(x))          \
    X(A, ND_SQRT, sqrt, ND_EW_SQRT(x))          \
    X(A, ND_SIGMOID, sigmoid, ND_EW_SIGMOID(x)) \
    X(A, ND_ABS, abs, ND_EW_ABS(x))             \
    X(A, ND_RELU, relu, (x > 0.0f || x != x) ? x : 0.0f)

/* Exact forms of ND_POW by a scalar exponent (x**2 in norms and variances
 * must be exactly x*x, which a general pow is not): X(A, id, name, exponent,
 * formula of x alone). */
#define ND_EWISE_POW_FORMS(X, A)             \
    X(A, ND_POW_SQUARE, square, 2.0f, x *x)  \
    X(A, ND_POW_CUBE, cube, 3.0f, x * x * x) \
    X(A, ND_POW_RECIPROCAL, reciprocal, -1.0f, 1.0f / x)

/* The op enums (engine.h's API), in list order. */
#define ND_EWISE_ENUMERATOR(A, id, name, formula) id,
typedef enum nd_binary_op {
    ND_EWISE_BINARY_OPS(ND_EWISE_ENUMERATOR, )
    ND_BINARY_OP_COUNT
} nd_binary_op;

typedef enum nd_unary_op {
    ND_EWISE_UNARY_OPS(ND_EWISE_ENUMERATOR, )
    ND_UNARY_OP_COUNT
} nd_unary_op;
#undef ND_EWISE_ENUMERATOR

/* How x**e is computed for a scalar e: ND_POW_GENERAL (the ND_POW formula)
 * or one of the exact forms; indexes the backends' tables. */
typedef enum nd_pow_form {
    ND_POW_GENERAL,
#define ND_EWISE_POW_ENUMERATOR(A, id, name, exponent, formula) id,
    ND_EWISE_POW_FORMS(ND_EWISE_POW_ENUMERATOR, )
#undef ND_EWISE_POW_ENUMERATOR
    ND_POW_FORM_COUNT
} nd_pow_form;

/* clang-format on */

/* The one place that decides the scalar-power shortcut, for both backends. */
static inline nd_pow_form nd_pow_form_of(float exponent) {
#define ND_EWISE_POW_MATCH(A, id, name, e, formula) \
    if (exponent == (e)) return id;
    ND_EWISE_POW_FORMS(ND_EWISE_POW_MATCH, )
#undef ND_EWISE_POW_MATCH
    return ND_POW_GENERAL;
}

#endif /* NEEDLE_EWISE_OPS_H */
