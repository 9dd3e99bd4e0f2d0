/* ewise_ops.h: the one list of needle's elementwise ops, each with its scalar
 * formula, made into the op enums here and expanded by both backends
 * into their kernels (cpu_loops.inc: the CPU loops and their table;
 * cuda/cuda_ewise.cu: the functors and the dispatch switch). An op is added
 * here, once; a backend never writes a formula of its own.
 *
 * C11 and CUDA C++ alike: macros and a static inline function, nothing else.
 *
 * A list is an X-macro: ND_EWISE_UNARY_OPS(X, A) calls X(A, id, name, ...,
 * formula) once per op, in enum order (each list says its fields; the
 * backends read id, name and formula, the binding the others); A is passed
 * through untouched (a backend passes the storage type it expands for; the
 * enums below, nothing).
 * A formula is one expression of the compute-type operands x (and y): the
 * type the storage type computes in (float for float32). It writes its
 * constants as float literals when they are exact in every compute type,
 * else as ND_EW_K(x, double literal): the constant in x's compute type, and its
 * functions as the ND_EW_* macros below, which the expanding backend defines
 * for its compute types before it expands a list:
 *   ND_EW_LOG(x) ND_EW_EXP(x) ND_EW_TANH(x) ND_EW_SQRT(x) ND_EW_SIGMOID(x)
 *   ND_EW_ABS(x) ND_EW_POW(x, y) ND_EW_ERF(x)
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

/* ND_EW_IF(field, text...): text, or nothing when field is the marker _
 * (a row's "no such class, function or method"). The binding expands its
 * rows through it; the backends never need it. */
#define ND_EW_IF(field, ...) ND_EW_CAT_(ND_EW_IF_, ND_EW_IS_NONE_(field))(__VA_ARGS__)
#define ND_EW_IF_0(...) __VA_ARGS__
#define ND_EW_IF_1(...)
#define ND_EW_IS_NONE_(field) ND_EW_SECOND_(ND_EW_NONE_##field, 0, ~)
#define ND_EW_NONE__ ~, 1
#define ND_EW_SECOND_(...) ND_EW_SECOND__(__VA_ARGS__)
#define ND_EW_SECOND__(a, b, ...) b
#define ND_EW_CAT_(a, b) ND_EW_CAT__(a, b)
#define ND_EW_CAT__(a, b) a##b

/* x op y, for arrays and scalars alike: needle's catalogue of binary ops.
 * X(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula):
 * the engine's op is ND_<id>; the binding makes of a row, where its field is
 * not _, the autograd op OP_EWISE_<id> of class `Ewise` (of two Tensors)
 * with the function ndl.ops.<ewise_fn>(a, b), the autograd op
 * OP_<id>_SCALAR of class `Scalar` (of a Tensor and its .scalar) with the
 * function ndl.ops.<scalar_fn>(a, scalar), and the method `method` of
 * NDArray and Tensor with the function ndl.ops.<method>(a, b) (an array or
 * a number: a row with a method names both classes), all documented by
 * `doc`. The gradients are the functions <name>_gradient and
 * <name>_scalar_gradient of needle_c/autograd/ops_binary.c. So a binary op
 * is added here, with its gradients and its test, and nowhere else, unless
 * it is an operator: the operators (+, -, <, ...) stay wired by hand, as
 * their slots and the course's graphs (a - b is a + (-b)) are not rows.
 * Comparisons have no autograd op (in the course neither); pick is the
 * engine's own.
 * Comparisons give 1.0 or 0.0; NaN propagates from either side of
 * maximum/minimum, as in NumPy. pick is half of where(c, x, y) = pick(x, c)
 * + pick(y, c == 0): -0 is the one value that leaves every other unchanged
 * under +, signed zeros, infinities and NaN included. */
#define ND_EWISE_BINARY_OPS(X, A)                                                             \
    X(A, ADD, add, EWiseAdd, add, AddScalar, add_scalar, _, "x + y.", x + y)                  \
    X(A, SUB, sub, _, _, _, _, _, "x - y.", x - y)                                            \
    X(A, MUL, mul, EWiseMul, multiply, MulScalar, mul_scalar, _, "x * y.", x * y)             \
    X(A, DIV, div, EWiseDiv, divide, DivScalar, divide_scalar, _, "x / y.", x / y)            \
    X(A, POW, pow, EWisePow, power, PowerScalar, power_scalar, _, "x ** y.", ND_EW_POW(x, y)) \
    X(A, MAXIMUM, maximum, Maximum, _, MaximumScalar, _, maximum,                             \
      "Elementwise maximum, as torch.maximum: NaN propagates, a tie's gradient is split "     \
      "evenly between the two.",                                                              \
      (x >= y || x != x) ? x : y)                                                             \
    X(A, MINIMUM, minimum, Minimum, _, MinimumScalar, _, minimum,                             \
      "Elementwise minimum, as torch.minimum; see maximum.", (x <= y || x != x) ? x : y)      \
    X(A, EQ, eq, _, _, _, _, _, "1 where x == y, else 0.", x == y ? 1.0f : 0.0f)              \
    X(A, NE, ne, _, _, _, _, _, "1 where x != y, else 0.", x != y ? 1.0f : 0.0f)              \
    X(A, GE, ge, _, _, _, _, _, "1 where x >= y, else 0.", x >= y ? 1.0f : 0.0f)              \
    X(A, GT, gt, _, _, _, _, _, "1 where x > y, else 0.", x > y ? 1.0f : 0.0f)                \
    X(A, LE, le, _, _, _, _, _, "1 where x <= y, else 0.", x <= y ? 1.0f : 0.0f)              \
    X(A, LT, lt, _, _, _, _, _, "1 where x < y, else 0.", x < y ? 1.0f : 0.0f)                \
    X(A, PICK, pick, _, _, _, _, _, "x where y != 0, else -0.", y != 0.0f ? x : -0.0f)

/* op x: needle's catalogue of unary ops. X(A, id, name, Class, doc, formula):
 * the engine's op is ND_<id>; the binding makes of each row the method
 * `name` of NDArray and Tensor, the autograd op OP_<id> of class `Class`
 * (needle_c.Class, ndl.ops.Class) and the function ndl.ops.<name>, all
 * documented by `doc`; the row's gradient is the function <name>_gradient
 * of needle_c/autograd/ops_unary.c. So a unary op is added here, with its
 * gradient and its test, and nowhere else (a formula that needs a new
 * function adds its ND_EW_* macro to both backends).
 * relu keeps NaN, as NumPy's maximum(x, 0) does; gelu is the exact (erf)
 * form, gelu_tanh PyTorch's approximate="tanh" one. */
#define ND_EWISE_UNARY_OPS(X, A)                                                              \
    X(A, NEG, neg, Negate, "-x.", -x)                                                         \
    X(A, LOG, log, Log, "Natural logarithm.", ND_EW_LOG(x))                                   \
    X(A, EXP, exp, Exp, "Exponential.", ND_EW_EXP(x))                                         \
    X(A, TANH, tanh, Tanh, "Hyperbolic tangent.", ND_EW_TANH(x))                              \
    X(A, SQRT, sqrt, Sqrt, "Square root.", ND_EW_SQRT(x))                                     \
    X(A, SIGMOID, sigmoid, Sigmoid, "1 / (1 + exp(-x)).", ND_EW_SIGMOID(x))                   \
    X(A, ABS, abs, Abs, "|x| (its gradient is 0 at 0, as PyTorch's).", ND_EW_ABS(x))         \
    X(A, RELU, relu, ReLU, "max(x, 0).", (x > 0.0f || x != x) ? x : 0.0f)                     \
    X(A, ERF, erf, Erf, "The error function.", ND_EW_ERF(x))                                  \
    X(A, GELU, gelu, GELU, "x * Phi(x), Phi the normal CDF (PyTorch's gelu).",                \
      x * 0.5f * (1.0f + ND_EW_ERF(x * ND_EW_K(x, 0.70710678118654752440))))                               \
    X(A, SILU, silu, SiLU, "x * sigmoid(x).", x * ND_EW_SIGMOID(x))                           \
    X(A, GELU_TANH, gelu_tanh, GELUTanh,                                                      \
      "PyTorch's gelu(x, approximate='tanh'): "                                               \
      "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))).",                          \
      0.5f * x * (1.0f + ND_EW_TANH(ND_EW_K(x, 0.79788456080286535588) *                    \
                                    (x + ND_EW_K(x, 0.044715) * x * x * x))))

/* Exact forms of ND_POW by a scalar exponent (x**2 in norms and variances
 * must be exactly x*x, which a general pow is not): X(A, id, name, exponent,
 * formula of x alone). */
#define ND_EWISE_POW_FORMS(X, A)             \
    X(A, ND_POW_SQUARE, square, 2.0f, x *x)  \
    X(A, ND_POW_CUBE, cube, 3.0f, x * x * x) \
    X(A, ND_POW_RECIPROCAL, reciprocal, -1.0f, 1.0f / x)

/* The op enums (engine.h's API), in list order. */
#define ND_EWISE_BINARY_ENUMERATOR(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, \
                                   formula)                                                  \
    ND_##id,
typedef enum nd_binary_op {
    ND_EWISE_BINARY_OPS(ND_EWISE_BINARY_ENUMERATOR, )
    ND_BINARY_OP_COUNT
} nd_binary_op;
#undef ND_EWISE_BINARY_ENUMERATOR

#define ND_EWISE_UNARY_ENUMERATOR(A, id, name, Class, doc, formula) ND_##id,
typedef enum nd_unary_op {
    ND_EWISE_UNARY_OPS(ND_EWISE_UNARY_ENUMERATOR, )
    ND_UNARY_OP_COUNT
} nd_unary_op;
#undef ND_EWISE_UNARY_ENUMERATOR

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
