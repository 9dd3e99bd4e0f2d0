/* autocast.c: dtype casts of Tensors (Tensor.astype, the Cast node) and
 * automatic mixed precision: the per-thread, per-device-type autocast state
 * that needle.amp.autocast sets, and the input casts the op-execution path
 * (dispatch.c) applies to a built-in op while it is on.
 *
 * The policy (which ops run in the narrow type, which in float32) is
 * python/needle/_autocast.py's, as PyTorch's autocast lists are its Python
 * side's: it hands this layer the table every op call reads
 * (_autocast_set_policy, at import). An op in neither list runs in the
 * widest dtype of its inputs (the engine's promotion). A cast is a recorded
 * Cast node, so a float32 parameter cast to bfloat16 gets a float32
 * gradient. float64 inputs are never narrowed, as in PyTorch.
 */
#include "tensor.h"

#include "ops_util.h"

/* ---------------------------------------------------------------- casts */

int value_dtype(needle_state *st, PyObject *value, nd_dtype *dtype) {
    /* The common case, without realize's references: backward asks this of every partial. */
    PyObject *cached = Tensor_CAST(value)->cached_data;
    if (cached != NULL && ndarray_check(st, cached)) {
        *dtype = nd_array_dtype(&NDArray_CAST(cached)->array);
        return 0;
    }
    PyObject *data = realize(st, value);
    if (data == NULL) return -1;
    int ok = ndarray_check(st, data);
    if (ok) *dtype = nd_array_dtype(&NDArray_CAST(data)->array);
    else
        PyErr_Format(PyExc_TypeError, "a cast needs a Tensor holding an NDArray, got %.100s",
                     Py_TYPE(data)->tp_name);
    Py_DECREF(data);
    return ok ? 0 : -1;
}

PyObject *cast_value(needle_state *st, PyObject *value, nd_dtype dtype) {
    nd_dtype have;
    if (value_dtype(st, value, &have) < 0) return NULL;
    if (have == dtype) return Py_NewRef(value);
    op_params p;
    memset(&p, 0, sizeof p);
    p.dtype = dtype;
    return apply1(st, OP_CAST, &p, value);
}

/* Tensor.astype(dtype): ndl.float16, "bfloat16", a NumPy dtype... */
PyObject *tensor_astype(PyObject *self, PyObject *dtype_obj) {
    needle_state *st = state_of_value(self);
    if (st == NULL) return NULL;
    nd_dtype dtype;
    if (parse_dtype_param(dtype_obj, &dtype) < 0) return NULL;
    return cast_value(st, self, dtype);
}

/* ------------------------------------------------------- autocast state */

enum { AUTOCAST_DEVICE_TYPES = 2 }; /* indexed by nd_device_kind: cpu, cuda */
static const char *const device_type_names[AUTOCAST_DEVICE_TYPES] = {
    [ND_DEVICE_CPU] = "cpu",
    [ND_DEVICE_CUDA] = "cuda",
};

/* PyTorch's defaults: bfloat16 on the CPU, float16 on CUDA. */
static _Thread_local struct {
    int enabled[AUTOCAST_DEVICE_TYPES];
    nd_dtype dtype[AUTOCAST_DEVICE_TYPES];
    int dtype_set[AUTOCAST_DEVICE_TYPES]; /* 0: the default above */
    int suspended;
} autocast_state;

_Thread_local int autocast_active = 0;

static nd_dtype autocast_dtype(int type) {
    if (autocast_state.dtype_set[type]) return autocast_state.dtype[type];
    return type == ND_DEVICE_CUDA ? ND_FLOAT16 : ND_BFLOAT16;
}

static void autocast_refresh(void) {
    int any = 0;
    for (int k = 0; k < AUTOCAST_DEVICE_TYPES; k++) any |= autocast_state.enabled[k];
    autocast_active = any && !autocast_state.suspended;
}

int autocast_suspend(void) {
    int previous = autocast_state.suspended;
    autocast_state.suspended = 1;
    autocast_refresh();
    return previous;
}

void autocast_resume(int previous) {
    autocast_state.suspended = previous;
    autocast_refresh();
}

/* ------------------------------------------------------- autocast policy */

typedef enum { CAST_NONE, CAST_NARROW, CAST_FLOAT32 } cast_policy;

static const char *const policy_names[] = {
    [CAST_NONE] = "none",
    [CAST_NARROW] = "narrow",
    [CAST_FLOAT32] = "float32",
};

/* The table by op kind is module state (autograd_state.autocast_policy);
 * written and read under the GIL. */
static cast_policy policy_of(needle_state *st, op_kind kind) {
    return (cast_policy)st->autograd->autocast_policy[kind];
}

/* The dtype an input of `have` is cast to under the policy (have: no cast). */
static nd_dtype policy_target(cast_policy policy, nd_dtype narrow, nd_dtype have) {
    if (have == ND_FLOAT64) return have;
    return policy == CAST_NARROW ? narrow : ND_FLOAT32;
}

PyObject *autocast_inputs(needle_state *st, op_kind kind, PyObject *inputs) {
    cast_policy policy = policy_of(st, kind);
    Py_ssize_t n = PyTuple_GET_SIZE(inputs);
    if (policy == CAST_NONE || n == 0 || !is_tensor(st, PyTuple_GET_ITEM(inputs, 0)))
        return Py_NewRef(inputs);
    /* The op's device type is its first input's (as PyTorch's dispatch key). */
    PyObject *first = realize(st, PyTuple_GET_ITEM(inputs, 0));
    if (first == NULL) return NULL;
    if (!ndarray_check(st, first)) {
        Py_DECREF(first);
        return Py_NewRef(inputs);
    }
    int type = (int)nd_device_get_kind(nd_storage_device(NDArray_CAST(first)->array.storage));
    Py_DECREF(first);
    if (type < 0 || type >= AUTOCAST_DEVICE_TYPES || !autocast_state.enabled[type])
        return Py_NewRef(inputs);
    nd_dtype narrow = autocast_dtype(type);
    PyObject *cast = PyTuple_New(n);
    if (cast == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(inputs, i), *y;
        nd_dtype have;
        if (!is_tensor(st, x)) {
            y = Py_NewRef(x); /* run_compute reports it */
        } else if (value_dtype(st, x, &have) < 0) {
            y = NULL;
        } else {
            y = cast_value(st, x, policy_target(policy, narrow, have));
        }
        if (y == NULL) {
            Py_DECREF(cast);
            return NULL;
        }
        PyTuple_SET_ITEM(cast, i, y);
    }
    return cast;
}

/* ------------------------------------------------------ module functions */

static int parse_device_type(PyObject *obj) {
    if (PyUnicode_Check(obj))
        for (int k = 0; k < AUTOCAST_DEVICE_TYPES; k++)
            if (PyUnicode_CompareWithASCIIString(obj, device_type_names[k]) == 0) return k;
    PyErr_Format(PyExc_ValueError, "autocast device type must be 'cpu' or 'cuda', got %R", obj);
    return -1;
}

/* The narrow dtype obj names, read by parse_dtype, so every spelling the
 * Tensor constructor takes ("half", numpy.float16, "f2"...) is taken here.
 * Another dtype, or a string that names none, is a ValueError; an object
 * that is no dtype at all a TypeError. */
static int check_autocast_dtype(PyObject *obj, nd_dtype *dtype) {
    int rc = parse_dtype(obj, dtype, NULL);
    if (rc == 1 && (*dtype == ND_FLOAT16 || *dtype == ND_BFLOAT16)) return 0;
    if (rc < 0) {
        /* parse_dtype's TypeError says "not a dtype"; anything else (a
         * MemoryError) is not ours to reword */
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear();
        if (!PyUnicode_Check(obj)) {
            PyErr_Format(PyExc_TypeError,
                         "autocast dtype must be float16 or bfloat16 (ndl.float16, 'half', "
                         "'bfloat16', numpy.float16...), got %.100s",
                         Py_TYPE(obj)->tp_name);
            return -1;
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "autocast dtype must be float16 or bfloat16 (ndl.float16, 'half', 'bfloat16', "
                 "numpy.float16...), got %R",
                 obj);
    return -1;
}

/* The state of one device type as (enabled, dtype name). */
static PyObject *state_tuple(int type) {
    return Py_BuildValue("(Os)", autocast_state.enabled[type] ? Py_True : Py_False,
                         nd_dtype_name(autocast_dtype(type)));
}

/* _autocast_set(device_type, enabled, dtype): returns the previous state. */
static PyObject *mod_autocast_set(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_autocast_set(device_type, enabled, dtype)");
        return NULL;
    }
    int type = parse_device_type(args[0]);
    if (type < 0) return NULL;
    int enabled = PyObject_IsTrue(args[1]);
    if (enabled < 0) return NULL;
    nd_dtype dtype;
    if (check_autocast_dtype(args[2], &dtype) < 0) return NULL;
    PyObject *previous = state_tuple(type);
    if (previous == NULL) return NULL;
    autocast_state.enabled[type] = enabled;
    autocast_state.dtype[type] = dtype;
    autocast_state.dtype_set[type] = 1;
    autocast_refresh();
    return previous;
}

/* _autocast_dtype(dtype): the name of the narrow dtype that dtype spells, or
 * the error _autocast_set would raise for it (autocast checks its argument
 * when made, before any state changes). */
static PyObject *mod_autocast_dtype(PyObject *module, PyObject *arg) {
    (void)module;
    nd_dtype dtype;
    if (check_autocast_dtype(arg, &dtype) < 0) return NULL;
    return PyUnicode_FromString(nd_dtype_name(dtype));
}

/* What ops see: off while suspended (inside a backward) whatever was set. */
static PyObject *mod_autocast_get(PyObject *module, PyObject *arg) {
    (void)module;
    int type = parse_device_type(arg);
    if (type < 0) return NULL;
    return Py_BuildValue(
        "(Os)", autocast_state.enabled[type] && !autocast_state.suspended ? Py_True : Py_False,
        nd_dtype_name(autocast_dtype(type)));
}

/* _autocast_set_policy({op class name: "narrow" | "float32"}): replaces the
 * table (ops not named: no cast). A name needle has no built-in op of, or
 * another policy, is a ValueError and leaves the table as it was. */
static PyObject *mod_autocast_set_policy(PyObject *module, PyObject *mapping) {
    if (!PyDict_Check(mapping)) {
        PyErr_Format(PyExc_TypeError, "the autocast policy is a dict, got %.100s",
                     Py_TYPE(mapping)->tp_name);
        return NULL;
    }
    unsigned char table[OP_KIND_COUNT] = {0};
    Py_ssize_t pos = 0;
    PyObject *name, *policy;
    while (PyDict_Next(mapping, &pos, &name, &policy)) {
        /* The error messages run repr(), which may run Python code that changes
         * the dict: hold the key and value while they are used. */
        Py_INCREF(name);
        Py_INCREF(policy);
        int kind = 0;
        for (int k = 1; k < OP_KIND_COUNT && PyUnicode_Check(name); k++)
            if (PyUnicode_CompareWithASCIIString(name, op_table[k].name) == 0) kind = k;
        if (kind == 0) {
            PyErr_Format(PyExc_ValueError, "autocast policy: %R is not a built-in op", name);
            Py_DECREF(name);
            Py_DECREF(policy);
            return NULL;
        }
        int chosen = -1;
        for (int c = CAST_NARROW; c <= CAST_FLOAT32 && PyUnicode_Check(policy); c++)
            if (PyUnicode_CompareWithASCIIString(policy, policy_names[c]) == 0) chosen = c;
        if (chosen < 0) {
            PyErr_Format(PyExc_ValueError,
                         "autocast policy of %R: expected 'narrow' or 'float32', got %R", name,
                         policy);
            Py_DECREF(name);
            Py_DECREF(policy);
            return NULL;
        }
        table[kind] = (unsigned char)chosen;
        Py_DECREF(name);
        Py_DECREF(policy);
    }
    memcpy(state_of_module(module)->autograd->autocast_policy, table, sizeof table);
    Py_RETURN_NONE;
}

/* The table in force as {op class name: policy}, the ops it casts only. */
static PyObject *mod_autocast_policy(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    const unsigned char *policy_table = state_of_module(module)->autograd->autocast_policy;
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (int k = 1; k < OP_KIND_COUNT; k++) {
        if (policy_table[k] == CAST_NONE) continue;
        PyObject *v = PyUnicode_FromString(policy_names[policy_table[k]]);
        if (v == NULL || PyDict_SetItemString(d, op_table[k].name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

PyMethodDef autocast_functions[] = {
    {"_autocast_set_policy", mod_autocast_set_policy, METH_O,
     "_autocast_set_policy(policy, /)\n--\n\nThe ops autocast casts: {op class name: 'narrow' "
     "or 'float32'} (needle._autocast sets it at import)."},
    {"_autocast_policy", mod_autocast_policy, METH_NOARGS,
     "_autocast_policy()\n--\n\nThe autocast policy in force, {op class name: policy}."},
    {"_autocast_set", (PyCFunction)(void (*)(void))mod_autocast_set, METH_FASTCALL,
     "_autocast_set(device_type, enabled, dtype, /)\n--\n\nThis thread's autocast state for "
     "device_type ('cpu' or 'cuda'); returns the previous (enabled, dtype)."},
    {"_autocast_dtype", mod_autocast_dtype, METH_O,
     "_autocast_dtype(dtype, /)\n--\n\nThe name of the narrow dtype (float16 or bfloat16) that "
     "dtype spells, in any spelling the Tensor constructor reads; ValueError or TypeError "
     "otherwise."},
    {"_autocast_get", mod_autocast_get, METH_O,
     "_autocast_get(device_type, /)\n--\n\nThis thread's (enabled, dtype) for device_type "
     "(enabled is False inside a backward, where autocast is suspended)."},
    {NULL, NULL, 0, NULL},
};
