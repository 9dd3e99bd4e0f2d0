/* tensor.h: what the autograd files of needle_c share: the Tensor and Op
 * object layouts, the table of built-in ops, and the one op-execution path
 * (dispatch.c) through which every op, Python's or C's, is computed and
 * recorded.
 *
 * Tensor, TensorTuple and Op hold Python references, so they are GC
 * containers (docs/design.md, "Rules for C code that holds Python objects"):
 * any call that may allocate device memory may run the collector, and with it
 * any finalizer, so hold strong references across it.
 */
#ifndef NEEDLE_TENSOR_H
#define NEEDLE_TENSOR_H

#include "runtime.h"

/* How a built-in op's compute takes its inputs. */
typedef enum op_input_kind {
    IN_ARRAYS, /* each input is an NDArray (a Tensor's data) */
    IN_TUPLE   /* each input is a tuple of NDArrays (a TensorTuple's data) */
} op_input_kind;

#define ARITY_ANY (-1)

/* The built-in ops: X(kind, class name, constructor signature, arity, input
 * kind, tuple output). The elementwise ones are the engine's catalogue
 * (ewise_ops.h): a unary row is kind OP_<id> of class Class; a binary row
 * is kind OP_EWISE_<id> of class Ewise (two Tensors) and kind
 * OP_<id>_SCALAR of class Scalar (a Tensor and a scalar), where it names
 * them. */
#define NEEDLE_UNARY_OP(X, id, name, Class, doc, formula) \
    X(OP_##id, #Class, SIG_NONE, 1, IN_ARRAYS, 0)
#define NEEDLE_BINARY_OP(X, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, formula) \
    ND_EW_IF(Ewise, X(OP_EWISE_##id, #Ewise, SIG_NONE, 2, IN_ARRAYS, 0))                        \
    ND_EW_IF(Scalar, X(OP_##id##_SCALAR, #Scalar, SIG_SCALAR, 1, IN_ARRAYS, 0))
#define NEEDLE_OPS(X)                                                             \
    ND_EWISE_BINARY_OPS(NEEDLE_BINARY_OP, X)                                      \
    X(OP_TRANSPOSE, "Transpose", SIG_AXES_OPT, 1, IN_ARRAYS, 0)                   \
    X(OP_RESHAPE, "Reshape", SIG_SHAPE, 1, IN_ARRAYS, 0)                          \
    X(OP_BROADCAST_TO, "BroadcastTo", SIG_SHAPE, 1, IN_ARRAYS, 0)                 \
    X(OP_SUMMATION, "Summation", SIG_AXES_OPT, 1, IN_ARRAYS, 0)                   \
    X(OP_MATMUL, "MatMul", SIG_NONE, 2, IN_ARRAYS, 0)                             \
    X(OP_MATMUL_BIAS, "MatMulBias", SIG_NONE, 3, IN_ARRAYS, 0)                    \
    ND_EWISE_UNARY_OPS(NEEDLE_UNARY_OP, X)                                        \
    X(OP_MAX, "Max", SIG_AXES_OPT, 1, IN_ARRAYS, 0)                               \
    X(OP_STACK, "Stack", SIG_AXIS, 1, IN_TUPLE, 0)                                \
    X(OP_SPLIT, "Split", SIG_AXIS, 1, IN_ARRAYS, 1)                               \
    X(OP_FLIP, "Flip", SIG_AXES, 1, IN_ARRAYS, 0)                                 \
    X(OP_DILATE, "Dilate", SIG_AXES_DILATION, 1, IN_ARRAYS, 0)                    \
    X(OP_UNDILATE, "UnDilate", SIG_AXES_DILATION, 1, IN_ARRAYS, 0)                \
    X(OP_CONV, "Conv", SIG_CONV, 2, IN_ARRAYS, 0)                                 \
    X(OP_LOG_SOFTMAX, "LogSoftmax", SIG_NONE, 1, IN_ARRAYS, 0)                    \
    X(OP_LOG_SUM_EXP, "LogSumExp", SIG_AXES_OPT, 1, IN_ARRAYS, 0)                 \
    X(OP_MAKE_TUPLE, "MakeTensorTuple", SIG_NONE, ARITY_ANY, IN_ARRAYS, 1)        \
    X(OP_TUPLE_GET_ITEM, "TupleGetItem", SIG_INDEX, 1, IN_TUPLE, 0)               \
    X(OP_FUSED_ADD_SCALARS, "FusedAddScalars", SIG_TWO_SCALARS, 1, IN_ARRAYS, 1)  \
    X(OP_GET_ITEM, "GetItem", SIG_KEY, 1, IN_ARRAYS, 0)                           \
    X(OP_SET_ITEM_GRAD, "ScatterSlice", SIG_KEY_SHAPE, 1, IN_ARRAYS, 0)           \
    X(OP_GATHER_ROWS, "GatherRows", SIG_NONE, 2, IN_ARRAYS, 0)                    \
    X(OP_SCATTER_ADD_ROWS, "ScatterAddRows", SIG_ROWS, 2, IN_ARRAYS, 0)           \
    X(OP_SOFTMAX_XENT, "SoftmaxCrossEntropy", SIG_NONE, 2, IN_ARRAYS, 0)          \
    X(OP_LSTM_CELL, "FusedLSTMCell", SIG_NONE, ARITY_ANY, IN_ARRAYS, 1)           \
    X(OP_LSTM, "FusedLSTM", SIG_NONE, ARITY_ANY, IN_ARRAYS, 1)                    \
    X(OP_LAYER_NORM, "LayerNorm", SIG_SCALAR, 3, IN_ARRAYS, 0)                    \
    X(OP_ATTN_SOFTMAX, "AttentionSoftmax", SIG_TWO_SCALARS, 1, IN_ARRAYS, 0)      \
    X(OP_SOFTMAX_XENT_GRAD, "SoftmaxCrossEntropyGrad", SIG_NONE, 3, IN_ARRAYS, 0) \
    X(OP_LAYER_NORM_GRAD, "LayerNormGrad", SIG_TWO_SCALARS, 3, IN_ARRAYS, 0)      \
    X(OP_ATTN_SOFTMAX_GRAD, "AttentionSoftmaxGrad", SIG_SCALAR, 2, IN_ARRAYS, 0)  \
    X(OP_CAST, "Cast", SIG_DTYPE, 1, IN_ARRAYS, 0)                                \
    X(OP_CLAMP, "Clamp", SIG_TWO_SCALARS, 1, IN_ARRAYS, 0)                        \
    X(OP_CLAMP_TENSOR, "ClampTensor", SIG_NONE, 3, IN_ARRAYS, 0)                  \
    X(OP_WHERE, "Where", SIG_NONE, 3, IN_ARRAYS, 0)

typedef enum op_kind {
    OP_PYTHON = 0, /* a TensorOp/TensorTupleOp subclass written in Python */
#define X(kind, name, sig, arity, inputs, tuple) kind,
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
    SIG_ROWS,          /* Op(num_rows)                      */
    SIG_DTYPE          /* Op(dtype): Cast                   */
} op_signature;

/* One row of NEEDLE_OPS. */
typedef struct op_info {
    const char *name;
    op_signature sig;
    Py_ssize_t arity; /* ARITY_ANY: any number of inputs */
    op_input_kind inputs;
    int tuple_output;
} op_info;

extern const op_info op_table[OP_KIND_COUNT];

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
    nd_dtype dtype;   /* Cast's target */
} op_params;

/* Every Value and Op carries a registry entry (runtime.h's needle_link): it
 * is on one of two doubly linked lists, so a scoped collection can walk
 * needle's objects without the process heap. refs, epoch and state are the
 * collection's scratch space (gc_refs of the collector's algorithm). */

typedef struct {
    PyObject_HEAD PyObject *dict;
    PyObject *weakreflist;
    needle_link link;
    op_kind kind;
    op_params p;
} OpObject;

/* Tensor and TensorTuple share this layout; a TensorTuple's cached_data
 * is a tuple of NDArrays. */
typedef struct {
    PyObject_HEAD PyObject *op;      /* Op or NULL (a leaf)          */
    PyObject *inputs;                /* tuple of Values, never NULL  */
    PyObject *cached_data;           /* NDArray / tuple, or NULL     */
    PyObject *grad;                  /* Tensor or NULL               */
    PyObject *grad_hooks;            /* dict id -> fn, or NULL (hooks.c) */
    PyObject *post_accumulate_hooks; /* the same, leaves only   */
    PyObject *dict;
    PyObject *weakreflist;
    needle_link link;
    int requires_grad;
    int retains_grad;
    Py_ssize_t num_outputs;
    int realizing;      /* realize() is computing this node's data (a cycle if met again) */
    uint64_t path_mark; /* find_topo_sort: the sort whose current path holds this node */
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
    /* autocast.c's policy by op kind (a cast_policy each); all "none" until
     * Python sets it. */
    unsigned char autocast_policy[OP_KIND_COUNT];
} autograd_state;

/* Whether ops record graph nodes in this thread (off inside no_grad() and
 * during a cycle-free backward); set_recording returns the previous value. */
int is_recording(void);
int set_recording(int on);

/* The module state of one of our Values or Ops: the runtime's module for
 * its exact Tensor and TensorTuple types (an operator call needs it every
 * time), else found through the type. */
needle_state *state_of_value(PyObject *value);

/* Is obj a Tensor (or subclass) / TensorTuple / any Value? */
int is_tensor(needle_state *st, PyObject *obj);
int is_tensor_tuple(needle_state *st, PyObject *obj);
int is_value(needle_state *st, PyObject *obj);

/* ------------- tensor.c: the node; tensor_type.c: its Python types */

/* The realised data of a Value, a NEW reference (NULL + exception on
 * failure): computing it may run the collector, which may replace the
 * node's cached_data. */
PyObject *realize(needle_state *st, PyObject *value);
/* A new leaf Tensor (or TensorTuple when data is a tuple) holding data. */
PyObject *make_const(needle_state *st, PyObject *data, int requires_grad);
/* A new, empty node of type (Tensor or TensorTuple). */
PyObject *value_alloc(PyTypeObject *type);
/* The shape of a Value's data copied into shape (ND_MAX_DIMS long). */
int value_shape(needle_state *st, PyObject *value, int *ndim, int64_t *shape);
/* 1 when two Tensors hold arrays of different shapes, 0 when not (or when
 * either is not a plain Tensor), -1 on error. */
int shapes_differ(needle_state *st, PyObject *a, PyObject *b);
/* Whether data may be a node's cached_data: an NDArray (tuple 0), a tuple of NDArrays
 * (tuple 1), or either (tuple -1). */
int node_data_ok(needle_state *st, PyObject *data, int tuple);
/* The Value, Tensor and TensorTuple types (tensor_type.c). */
int tensor_types_init(PyObject *module, needle_state *st);
/* The GC slots of Values (tensor.c) and Ops (op.c); scoped.c recognises
 * needle's objects by them. value_clear leaves inputs as the empty tuple
 * (never NULL). */
int value_traverse(PyObject *op, visitproc visit, void *arg);
int value_clear(PyObject *op);
void value_dealloc(PyObject *op);
int op_traverse(PyObject *op, visitproc visit, void *arg);

/* The registry (registry.c), which memory/scoped.c walks: link a Value or
 * Op once it is valid (after tp_alloc), unlink it first thing in its dealloc
 * (idempotent). */
void registry_link_value(PyObject *value);
void registry_unlink_value(PyObject *value);
void registry_link_op(PyObject *op);
void registry_unlink_op(PyObject *op);

/* The gc_blind switch (tensor.c), read by every autograd tp_traverse. */
int autograd_gc_visible(void);
extern PyMethodDef gc_visibility_functions[];

/* ---------------------------- hooks.c: gradient hooks, backward's end */

/* Tensor.register_hook / register_post_accumulate_grad_hook (METH_O). */
PyObject *value_register_hook(PyObject *self, PyObject *fn);
PyObject *value_register_post_accumulate_grad_hook(PyObject *self, PyObject *fn);
/* node's grad hooks applied to grad, in registration order: a new reference
 * to the gradient to use (grad itself when there are none), NULL on error. */
PyObject *run_grad_hooks(needle_state *st, PyObject *node, PyObject *grad);
/* node's post-accumulate-grad hooks, called with node; -1 on error. */
int run_post_accumulate_hooks(PyObject *node);
/* Brackets one backward: backward_exit(rc) returns rc, or -1 when a queued
 * callback raised; the outermost runs the callbacks when rc is 0. */
void backward_enter(void);
int backward_exit(int rc);
int hooks_module_init(PyObject *module);

/* ------------------------------------- alloc_sites.c: leak diagnostics */

/* Counts a new Value and, when history recording is on, stores the Python
 * frames that made it in its _alloc_site attribute. */
void alloc_site_record(PyObject *value);
void alloc_site_forget(PyObject *value);
extern PyMethodDef alloc_site_functions[];

/* ----------------------------- dispatch.c: the one op-execution path */

/* True when some input (a tuple of Values) requires grad. */
int inputs_require_grad(PyObject *inputs);
/* Runs op on inputs (a tuple): each input is checked to be a Value and
 * realised, the built-in's arity and input kinds are checked once, every
 * input array is held for the whole compute. op is an Op object, or NULL to
 * run the built-in `kind` with params p (no Op object needed). New
 * reference: an NDArray, or a tuple for tuple ops. */
PyObject *run_compute(needle_state *st, PyObject *op, op_kind kind, const op_params *p,
                      PyObject *inputs);
/* The same on arrays already realised (Op.compute called from Python). */
PyObject *compute_arrays(needle_state *st, op_kind kind, const op_params *p,
                         PyObject *const *arrays, Py_ssize_t n);
/* Records op(inputs) -> a node: the generic make_from_op for any Op. */
PyObject *make_from_op(needle_state *st, PyObject *op, PyObject *inputs, int tuple_output);
/* Applies a built-in op to inputs (a tuple of Values): records a graph node
 * when recording and some input requires grad, else returns a detached
 * result without building an Op object. */
PyObject *apply_op(needle_state *st, op_kind kind, const op_params *p, PyObject *inputs);
/* apply_op on one or two Values (held by the caller). */
PyObject *apply1(needle_state *st, op_kind kind, const op_params *p, PyObject *a);
PyObject *apply2(needle_state *st, op_kind kind, const op_params *p, PyObject *a, PyObject *b);
/* A built-in op's gradient (its C formula) as a new tuple; node is a Value. */
PyObject *builtin_gradient(needle_state *st, OpObject *op, PyObject *out_grad, PyObject *node);
/* op.gradient(out_grad, node) as a new tuple with one gradient per input. */
PyObject *run_gradient(needle_state *st, PyObject *op, PyObject *out_grad, PyObject *node);
/* The same for a backward walk that drops the gradients of inputs that
 * neither require nor retain grad: with prune set, a built-in may put None
 * in their place instead of computing them (a Python op computes all). */
PyObject *builtin_gradient_for(needle_state *st, OpObject *op, PyObject *out_grad, PyObject *node,
                               int prune);
PyObject *run_gradient_for(needle_state *st, PyObject *op, PyObject *out_grad, PyObject *node,
                           int prune);

/* ------------------------------ autocast.c: automatic mixed precision */

/* Nonzero while autocast is on for some device type in this thread and not
 * suspended (a backward walk suspends it): the one test every op call pays. */
extern _Thread_local int autocast_active;
/* The inputs a built-in op of kind runs on under autocast (a new reference):
 * inputs itself, or a new tuple with some inputs cast (recorded Cast nodes).
 * Call only when autocast_active. */
PyObject *autocast_inputs(needle_state *st, op_kind kind, PyObject *inputs);
/* Suspends autocast in this thread (returns the previous state for
 * autocast_resume): gradients run in the dtypes the forward chose. */
int autocast_suspend(void);
void autocast_resume(int previous);
extern PyMethodDef autocast_functions[];

/* value cast to dtype (a new reference): value itself when its data already
 * has dtype, else a Cast node (recorded as any op is). */
PyObject *cast_value(needle_state *st, PyObject *value, nd_dtype dtype);
/* The dtype of a Tensor's data, realising it; -1 with an exception set when
 * it holds no NDArray. */
int value_dtype(needle_state *st, PyObject *value, nd_dtype *dtype);

/* ----------------------------------------------- op.c: the Op types */

/* True when op is exactly a built-in op class (its C code runs directly). */
int op_dispatches_in_c(needle_state *st, PyObject *op);
/* A new built-in Op object of kind with params p. */
PyObject *op_new_builtin(needle_state *st, op_kind kind, const op_params *p);
int op_types_init(PyObject *module, needle_state *st);

/* --------------------------------- per-op implementations (ops_*.c) */

typedef struct grad_scope grad_scope;

/* compute runs on NDArrays (checked by dispatch.c) and returns a new
 * NDArray (a tuple for tuple ops); gradient runs on Tensors inside a scope
 * that owns every object it touches, and returns the scope's tuple of one
 * gradient per input (borrowed from the scope). */
typedef PyObject *(*op_compute_fn)(needle_state *st, const op_params *p, PyObject *const *arrays,
                                   Py_ssize_t n);
typedef PyObject *(*op_gradient_fn)(grad_scope *s, const op_params *p, PyObject *g, PyObject *node);

typedef struct op_impl {
    op_compute_fn compute;
    op_gradient_fn gradient;
} op_impl;

/* Filled at start-up by each ops_*.c file's register function. */
extern op_impl op_impls[OP_KIND_COUNT];
void ops_basic_register(op_impl *table);
/* ops_unary.c, ops_binary.c: the catalogue's unary and binary ops;
 * ops_select.c: clamp, where. */
void ops_unary_register(op_impl *table);
void ops_binary_register(op_impl *table);
/* needle_c.UNARY_OPS: the catalogue's unary rows as (name, class name,
 * doc); needle_c.BINARY_OPS: its binary rows as (name, Ewise, ewise_fn,
 * Scalar, scalar_fn, method, doc), None for a _; from which needle.ops
 * makes its classes and functions. */
int ops_unary_export(PyObject *module);
int ops_binary_export(PyObject *module);
void ops_select_register(op_impl *table);
void ops_nn_register(op_impl *table);
/* ops_lstm.c; called by ops_nn_register. */
void ops_lstm_register(op_impl *table);
/* ops_fused.c (layer norm, attention softmax); called by autograd.c. */
void ops_fused_register(op_impl *table);

/* ---------------------------------------- Tensor methods and slots */

/* tensor_ops.c: operators and shape methods of Tensor, sequence methods
 * of TensorTuple; autograd.c: backward. Tensor's type tables (tensor_type.c)
 * name them. */
/* An Op's or a Tensor method's axes argument into p (op.c): None leaves
 * axes_given 0; otherwise array/parse.c's parse_axes. */
int op_parse_axes(needle_state *st, PyObject *obj, op_params *p);
PyObject *tensor_add(PyObject *a, PyObject *b);
PyObject *tensor_sub(PyObject *a, PyObject *b);
PyObject *tensor_mul(PyObject *a, PyObject *b);
PyObject *tensor_div(PyObject *a, PyObject *b);
PyObject *tensor_pow(PyObject *a, PyObject *b, PyObject *mod);
PyObject *tensor_neg(PyObject *a);
PyObject *tensor_matmul(PyObject *a, PyObject *b);
PyObject *tensor_getitem(PyObject *a, PyObject *key);
PyObject *tensor_sum(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *tensor_reshape(PyObject *self, PyObject *args);
PyObject *tensor_broadcast_to(PyObject *self, PyObject *args);
PyObject *tensor_transpose(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *tensor_matmul_method(PyObject *a, PyObject *b);
/* One method per unary op of the catalogue (ewise_ops.h): t.<name>(). */
#define NEEDLE_TENSOR_UNARY_DECL(A, id, name, Class, doc, formula) \
    PyObject *tensor_unary_##name(PyObject *self, PyObject *ignored);
ND_EWISE_UNARY_OPS(NEEDLE_TENSOR_UNARY_DECL, )
#undef NEEDLE_TENSOR_UNARY_DECL
PyObject *tensor_abs_slot(PyObject *a);
/* One method per binary row of the catalogue that names one: t.<method>(other). */
#define NEEDLE_TENSOR_BINARY_DECL(A, id, name, Ewise, ewise_fn, Scalar, scalar_fn, method, doc, \
                                  formula)                                                      \
    ND_EW_IF(method, PyObject *tensor_binary_##name(PyObject *self, PyObject *other);)
ND_EWISE_BINARY_OPS(NEEDLE_TENSOR_BINARY_DECL, )
#undef NEEDLE_TENSOR_BINARY_DECL
PyObject *tensor_clamp(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *tensor_astype(PyObject *self, PyObject *dtype);
Py_ssize_t tuple_length(PyObject *self);
PyObject *tuple_item(PyObject *self, PyObject *key);
PyObject *tuple_sq_item(PyObject *self, Py_ssize_t i);
PyObject *tuple_as_tuple(PyObject *self, PyObject *ignored);
PyObject *tuple_add(PyObject *a, PyObject *b);
PyObject *tuple_repr(PyObject *self);
PyObject *fold_make_tuple_item(needle_state *st, PyObject *value, Py_ssize_t i);
PyObject *tensor_backward(PyObject *self, PyObject *args, PyObject *kwargs);

/* Type specs and module functions of the autograd files. */
int autograd_module_init(PyObject *module, needle_state *st);
int autograd_traverse(needle_state *st, visitproc visit, void *arg);
void autograd_clear(needle_state *st);

#endif /* NEEDLE_TENSOR_H */
