/* tensor.h: what the autograd files of needle_c share: the Tensor and Op
 * object layouts, the table of built-in ops, and the helpers through which
 * C code applies ops to tensors (gradients are built that way).
 *
 * Tensor, TensorTuple and Op hold Python references, so they are GC
 * containers; the rules of DESIGN.md ("Rules that keep it correct") apply:
 * any call that may allocate device memory may run the collector, so hold
 * strong references across it.
 */
#ifndef NEEDLE_TENSOR_H
#define NEEDLE_TENSOR_H

#include "needle_c.h"

/* The built-in ops: X(kind, class name, function name, signature, tuple output). */
#define NEEDLE_OPS(X)                                                         \
    X(OP_EWISE_ADD, "EWiseAdd", "add", SIG_NONE, 0)                           \
    X(OP_ADD_SCALAR, "AddScalar", "add_scalar", SIG_SCALAR, 0)                \
    X(OP_EWISE_MUL, "EWiseMul", "multiply", SIG_NONE, 0)                      \
    X(OP_MUL_SCALAR, "MulScalar", "mul_scalar", SIG_SCALAR, 0)                \
    X(OP_EWISE_POW, "EWisePow", "power", SIG_NONE, 0)                         \
    X(OP_POWER_SCALAR, "PowerScalar", "power_scalar", SIG_SCALAR, 0)          \
    X(OP_EWISE_DIV, "EWiseDiv", "divide", SIG_NONE, 0)                        \
    X(OP_DIV_SCALAR, "DivScalar", "divide_scalar", SIG_SCALAR, 0)             \
    X(OP_TRANSPOSE, "Transpose", "transpose", SIG_AXES_OPT, 0)                \
    X(OP_RESHAPE, "Reshape", "reshape", SIG_SHAPE, 0)                         \
    X(OP_BROADCAST_TO, "BroadcastTo", "broadcast_to", SIG_SHAPE, 0)           \
    X(OP_SUMMATION, "Summation", "summation", SIG_AXES_OPT, 0)                \
    X(OP_MATMUL, "MatMul", "matmul", SIG_NONE, 0)                             \
    X(OP_NEGATE, "Negate", "negate", SIG_NONE, 0)                             \
    X(OP_LOG, "Log", "log", SIG_NONE, 0)                                      \
    X(OP_EXP, "Exp", "exp", SIG_NONE, 0)                                      \
    X(OP_RELU, "ReLU", "relu", SIG_NONE, 0)                                   \
    X(OP_TANH, "Tanh", "tanh", SIG_NONE, 0)                                   \
    X(OP_SIGMOID, "Sigmoid", "sigmoid", SIG_NONE, 0)                          \
    X(OP_SQRT, "Sqrt", "sqrt", SIG_NONE, 0)                                   \
    X(OP_MAX, "Max", "max", SIG_AXES_OPT, 0)                                  \
    X(OP_STACK, "Stack", "stack", SIG_AXIS, 0)                                \
    X(OP_SPLIT, "Split", "split", SIG_AXIS, 1)                                \
    X(OP_FLIP, "Flip", "flip", SIG_AXES, 0)                                   \
    X(OP_DILATE, "Dilate", "dilate", SIG_AXES_DILATION, 0)                    \
    X(OP_UNDILATE, "UnDilate", "undilate", SIG_AXES_DILATION, 0)              \
    X(OP_CONV, "Conv", "conv", SIG_CONV, 0)                                   \
    X(OP_LOG_SOFTMAX, "LogSoftmax", "logsoftmax", SIG_NONE, 0)                \
    X(OP_LOG_SUM_EXP, "LogSumExp", "logsumexp", SIG_AXES_OPT, 0)              \
    X(OP_MAKE_TUPLE, "MakeTensorTuple", "make_tuple", SIG_NONE, 1)            \
    X(OP_TUPLE_GET_ITEM, "TupleGetItem", "tuple_get_item", SIG_INDEX, 0)      \
    X(OP_FUSED_ADD_SCALARS, "FusedAddScalars", "fused_add_scalars", SIG_TWO_SCALARS, 1) \
    X(OP_GET_ITEM, "GetItem", "getitem", SIG_KEY, 0)                          \
    X(OP_SET_ITEM_GRAD, "ScatterSlice", "scatter_slice", SIG_KEY_SHAPE, 0)    \
    X(OP_GATHER_ROWS, "GatherRows", "gather_rows", SIG_NONE, 0)               \
    X(OP_SCATTER_ADD_ROWS, "ScatterAddRows", "scatter_add_rows", SIG_ROWS, 0) \
    X(OP_SOFTMAX_XENT, "SoftmaxCrossEntropy", "softmax_cross_entropy", SIG_NONE, 0)

typedef enum op_kind {
    OP_PYTHON = 0, /* a TensorOp/TensorTupleOp subclass written in Python */
#define X(kind, name, fn, sig, tuple) kind,
    NEEDLE_OPS(X)
#undef X
        OP_KIND_COUNT
} op_kind;

/* How an op's constructor arguments are parsed. */
typedef enum op_signature {
    SIG_NONE,          /* Op()                              */
    SIG_SCALAR,        /* Op(scalar)                        */
    SIG_TWO_SCALARS,   /* Op(c0, c1)                        */
    SIG_AXES_OPT,      /* Op(axes=None)                     */
    SIG_AXES,          /* Op(axes)                          */
    SIG_SHAPE,         /* Op(shape)                         */
    SIG_AXIS,          /* Op(axis)                          */
    SIG_AXES_DILATION, /* Op(axes, dilation)                */
    SIG_CONV,          /* Op(stride=1, padding=0)           */
    SIG_INDEX,         /* Op(index)                         */
    SIG_KEY,           /* Op(key): a getitem index          */
    SIG_KEY_SHAPE,     /* Op(key, shape)                    */
    SIG_ROWS           /* Op(num_rows)                      */
} op_signature;

typedef struct op_params {
    double scalar, scalar2;
    int axes_given; /* 0: axes=None */
    int naxes;
    int axes[ND_MAX_DIMS];
    int ndim; /* shape for Reshape/BroadcastTo/ScatterSlice */
    int64_t shape[ND_MAX_DIMS];
    int axis, dilation, stride, padding;
    Py_ssize_t index; /* TupleGetItem; ScatterAddRows' row count */
    PyObject *key;    /* GetItem/ScatterSlice index (owned; a tuple) */
} op_params;

typedef struct {
    PyObject_HEAD
    PyObject *dict;
    PyObject *weakreflist;
    op_kind kind;
    op_params p;
} OpObject;

/* Tensor and TensorTuple share this layout; a TensorTuple's cached_data
 * is a tuple of NDArrays. */
typedef struct {
    PyObject_HEAD
    PyObject *op;          /* Op or NULL (a leaf)          */
    PyObject *inputs;      /* tuple of Values, never NULL  */
    PyObject *cached_data; /* NDArray / tuple, or NULL     */
    PyObject *grad;        /* Tensor or NULL               */
    PyObject *dict;
    PyObject *weakreflist;
    int requires_grad;
    int retains_grad;
    Py_ssize_t num_outputs;
} TensorObject;

#define Op_CAST(o) ((OpObject *)(o))
#define Tensor_CAST(o) ((TensorObject *)(o))

typedef enum graph_mode { GRAPH_CYCLE_FREE = 0, GRAPH_NEEDLE = 1 } graph_mode;

/* The autograd's state: module state extension (see needle_state). */
typedef struct autograd_state {
    PyTypeObject *value_type, *tensor_type, *tensor_tuple_type;
    PyTypeObject *op_type, *tensor_op_type, *tensor_tuple_op_type;
    PyTypeObject *op_types[OP_KIND_COUNT];
    graph_mode mode;
    int recording; /* 0 inside no_grad() and during cycle-free backward */
} autograd_state;

autograd_state *autograd_of(needle_state *st);
needle_state *state_of_value(PyObject *value);

/* Is obj a Tensor (or subclass) / TensorTuple / any Value? */
int is_tensor(needle_state *st, PyObject *obj);
int is_tensor_tuple(needle_state *st, PyObject *obj);

/* The realised data of a Value (borrowed; NULL + exception on failure). */
PyObject *realize(needle_state *st, PyObject *value);

/* A new leaf Tensor (or TensorTuple when data is a tuple) holding data. */
PyObject *make_const(needle_state *st, PyObject *data, int requires_grad);

/* Applies a built-in op to inputs (a tuple of Values): records a graph node
 * when recording and some input requires grad, else returns a detached
 * result without building an Op object. */
PyObject *apply_op(needle_state *st, op_kind kind, const op_params *p, PyObject *inputs);
/* Shorthands for gradient code (inputs are borrowed). */
PyObject *apply1(needle_state *st, op_kind kind, const op_params *p, PyObject *a);
PyObject *apply2(needle_state *st, op_kind kind, const op_params *p, PyObject *a, PyObject *b);

/* True when op is exactly a built-in op class (its C code runs directly). */
int op_dispatches_in_c(needle_state *st, PyObject *op);
int op_is_tuple_output(op_kind kind);
/* Checks the inputs' count and kinds before a built-in compute (0 or -1). */
int check_compute_inputs(needle_state *st, op_kind kind, PyObject *const *arrays, Py_ssize_t n);
const char *op_kind_name(op_kind kind);
/* op.gradient(out_grad, node) as a new tuple. */
PyObject *op_gradient_as_tuple(needle_state *st, PyObject *op, PyObject *out_grad, PyObject *node);
Py_ssize_t tensor_live_count(void);
int tensor_types_init(PyObject *module, needle_state *st);
int op_types_init(PyObject *module, needle_state *st);

/* Records op(inputs) -> a node: the generic make_from_op for any Op. */
PyObject *make_from_op(needle_state *st, PyObject *op, PyObject *inputs, int tuple_output);

/* Per-op implementation (ops_*.c): compute on NDArrays, gradient on Tensors.
 * compute returns a new NDArray (a tuple for tuple ops); gradient returns a
 * new tuple with one Tensor per input. */
typedef PyObject *(*op_compute_fn)(needle_state *st, const op_params *p, PyObject *const *arrays,
                                   Py_ssize_t n);
typedef PyObject *(*op_gradient_fn)(needle_state *st, const op_params *p, PyObject *out_grad,
                                    PyObject *node);

typedef struct op_impl {
    op_compute_fn compute;
    op_gradient_fn gradient;
} op_impl;

/* Filled at start-up by each ops_*.c file's register function. */
extern op_impl op_impls[OP_KIND_COUNT];
void ops_basic_register(op_impl *table);
void ops_nn_register(op_impl *table);

/* NDArray helpers for op code (arrays are NDArray objects; results new). */
PyObject *nd_binary_arrays(needle_state *st, nd_binary_op op, PyObject *a, PyObject *b);
PyObject *nd_binary_scalar(needle_state *st, nd_binary_op op, PyObject *a, double s, int reflected);
PyObject *nd_unary_array(needle_state *st, nd_unary_op op, PyObject *a);
PyObject *nd_reduce_array(needle_state *st, nd_reduce_op op, PyObject *a, uint32_t mask, int keepdims);
PyObject *nd_layout_view(needle_state *st, PyObject *a, const nd_layout *layout);
PyObject *nd_compact_array(needle_state *st, PyObject *a);
PyObject *nd_reshape_array(needle_state *st, PyObject *a, int ndim, const int64_t *shape);
PyObject *nd_empty_like_shape(needle_state *st, PyObject *like, int ndim, const int64_t *shape);
const nd_layout *array_layout(PyObject *a);
const int64_t *value_shape(needle_state *st, PyObject *value, int *ndim);

/* Type specs and module functions of the autograd files. */
int autograd_module_init(PyObject *module, needle_state *st);
int autograd_traverse(needle_state *st, visitproc visit, void *arg);
void autograd_clear(needle_state *st);

#endif /* NEEDLE_TENSOR_H */
