/* optim.c: the module functions adam_update and sgd_update, the binding of
 * the engine's fused optimizer updates (engine.h) that needle.optim calls
 * once per parameter, and amp_unscale_, needle.amp.GradScaler's unscale.
 *
 * They take the course's hyperparameters as Python numbers and compute in
 * double what the unfused Python code computes from them (1 - beta1 and
 * 1 - beta1**t; the engine rounds them to float32 for a float32 update, as
 * that code's float32 ops do, and keeps them for a float64 one), accept each
 * array as an NDArray or a Tensor (its data), and return the new parameter
 * as an NDArray: the caller stores it as the parameter's data, so a user
 * holding the old data keeps the old values, while the moments are updated
 * in place. Everything a step passes is positional (METH_FASTCALL): this
 * runs once per parameter per step. A capturable Adam passes its device
 * state instead of lr and t and gets its parameter updated in place
 * (engine.h's nd_adam_hyper), and counts its steps with adam_count_step.
 */
#include "autograd/tensor.h"

#include <math.h>
#include <stdio.h>

/* The NDArray of obj (an NDArray, or a Tensor's realised data) as a new
 * reference: held across the update, whose allocation may run the collector
 * and with it code that replaces a Tensor's data. */
static PyObject *array_of(needle_state *st, PyObject *obj, const char *fname, const char *name) {
    if (ndarray_check(st, obj)) return Py_NewRef(obj);
    if (is_tensor(st, obj)) {
        PyObject *data = realize(st, obj);
        if (data != NULL && !ndarray_check(st, data)) {
            PyErr_Format(PyExc_TypeError, "%s: %s holds a %.100s, not an NDArray", fname, name,
                         Py_TYPE(data)->tp_name);
            Py_CLEAR(data);
        }
        return data;
    }
    PyErr_Format(PyExc_TypeError, "%s: %s must be an NDArray or a Tensor, got %.100s", fname, name,
                 Py_TYPE(obj)->tp_name);
    return NULL;
}

/* The real number obj (a bool is refused: it is a flag, not a rate). */
static int real_arg(PyObject *obj, const char *fname, const char *name, double *out) {
    *out = PyBool_Check(obj) ? -1.0 : PyFloat_AsDouble(obj);
    if (PyBool_Check(obj) || (*out == -1.0 && PyErr_Occurred())) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a real number, got %.100s", fname, name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

enum { MAX_ARRAYS = 4, MAX_NUMBERS = 6 };

/* args: narrays arrays, then nnumbers numbers, all positional. arrays[]
 * gets new references (released by release_arrays, also on failure). */
static int parse_update_args(needle_state *st, const char *fname, PyObject *const *args,
                             Py_ssize_t nargs, int narrays, const char *const *array_names,
                             int nnumbers, const char *const *number_names, PyObject **arrays,
                             double *numbers) {
    for (int i = 0; i < narrays; i++) arrays[i] = NULL;
    if (nargs != narrays + nnumbers) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d positional arguments (%zd given)", fname,
                     narrays + nnumbers, nargs);
        return -1;
    }
    for (int i = 0; i < nnumbers; i++)
        if (real_arg(args[narrays + i], fname, number_names[i], &numbers[i]) < 0) return -1;
    for (int i = 0; i < narrays; i++)
        if ((arrays[i] = array_of(st, args[i], fname, array_names[i])) == NULL) return -1;
    return 0;
}

static void release_arrays(PyObject **arrays, int n) {
    for (int i = 0; i < n; i++) Py_CLEAR(arrays[i]);
}

#define ARRAY(obj) (&NDArray_CAST(obj)->array)

/* adam_update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step,
 * state=None): with a state (a capturable Adam's [t, lr] on the parameter's
 * device) lr and step must be None, as the update reads them from it when it
 * runs, and the parameter is updated in place (returns None). */
static PyObject *optim_adam_update(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    static const char fname[] = "adam_update";
    static const char *const array_names[] = {"param", "grad", "m", "v", "state"};
    static const char *const number_names[] = {"lr",  "beta1",        "beta2",
                                               "eps", "weight_decay", "step"};
    needle_state *st = state_of_module(module);
    if (nargs != 10 && nargs != 11) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes 10 positional arguments, or 11 with a state (%zd given)", fname,
                     nargs);
        return NULL;
    }
    const int narrays = nargs == 11 && args[10] != Py_None ? 5 : 4;
    const int capturable = narrays == 5;
    double x[MAX_NUMBERS];
    for (int i = 0; i < 6; i++) {
        PyObject *arg = args[4 + i];
        if (capturable && (i == 0 || i == 5)) { /* lr and step: read from the state */
            if (arg != Py_None) {
                PyErr_Format(PyExc_TypeError,
                             "%s: %s must be None when a state is given (the update reads it "
                             "from the state), got %.100s",
                             fname, number_names[i], Py_TYPE(arg)->tp_name);
                return NULL;
            }
            x[i] = i == 0 ? 0.0 : 1.0;
        } else if (real_arg(arg, fname, number_names[i], &x[i]) < 0) {
            return NULL;
        }
    }
    double lr = x[0], beta1 = x[1], beta2 = x[2], eps = x[3], weight_decay = x[4], step = x[5];
    if (!(step >= 1.0) || step != floor(step) || step >= 9007199254740992.0) {
        PyErr_Format(PyExc_ValueError, "%s: step must be an integer >= 1 (below 2**53), got %R",
                     fname, args[9]);
        return NULL;
    }
    PyObject *arrays[MAX_ARRAYS + 1] = {NULL};
    for (int i = 0; i < narrays; i++) {
        if ((arrays[i] = array_of(st, args[i < 4 ? i : 10], fname, array_names[i])) == NULL) {
            release_arrays(arrays, narrays);
            return NULL;
        }
    }
    nd_adam_hyper h = {
        .lr = lr,
        .beta1 = beta1,
        .one_minus_beta1 = 1.0 - beta1,
        .beta2 = beta2,
        .one_minus_beta2 = 1.0 - beta2,
        .eps = eps,
        .weight_decay = weight_decay,
        .bias_correction1 = nd_adam_bias_correction(beta1, step),
        .bias_correction2 = nd_adam_bias_correction(beta2, step),
        .state = capturable ? ARRAY(arrays[4]) : NULL,
    };
    nd_array out;
    nd_status status = nd_array_adam_update(ARRAY(arrays[0]), ARRAY(arrays[1]), ARRAY(arrays[2]),
                                            ARRAY(arrays[3]), &h, &out);
    release_arrays(arrays, narrays);
    if (status != ND_OK) return raise_status(st, status);
    if (capturable) Py_RETURN_NONE;
    return ndarray_wrap(st, &out);
}

/* adam_count_step(state): t += 1 in a capturable Adam's state, on its device. */
static PyObject *optim_adam_count_step(PyObject *module, PyObject *arg) {
    needle_state *st = state_of_module(module);
    PyObject *state = array_of(st, arg, "adam_count_step", "state");
    if (state == NULL) return NULL;
    nd_status status = nd_array_adam_count_step(ARRAY(state));
    Py_DECREF(state);
    if (status != ND_OK) return raise_status(st, status);
    Py_RETURN_NONE;
}

static PyObject *optim_sgd_update(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    static const char *const array_names[] = {"param", "grad", "u"};
    static const char *const number_names[] = {"lr", "momentum", "weight_decay"};
    needle_state *st = state_of_module(module);
    PyObject *arrays[MAX_ARRAYS];
    double x[MAX_NUMBERS];
    if (parse_update_args(st, "sgd_update", args, nargs, 3, array_names, 3, number_names, arrays,
                          x) < 0) {
        release_arrays(arrays, 3);
        return NULL;
    }
    double lr = x[0], momentum = x[1], weight_decay = x[2];
    nd_sgd_hyper h = {
        .lr = lr,
        .momentum = momentum,
        .one_minus_momentum = 1.0 - momentum,
        .weight_decay = weight_decay,
    };
    nd_array out;
    nd_status status =
        nd_array_sgd_update(ARRAY(arrays[0]), ARRAY(arrays[1]), ARRAY(arrays[2]), &h, &out);
    release_arrays(arrays, 3);
    if (status != ND_OK) return raise_status(st, status);
    return ndarray_wrap(st, &out);
}

/* amp_unscale_(grads, found_inf, inv_scale): GradScaler's unscale of one
 * device's gradients in one call (engine.h's nd_array_amp_unscale). The
 * sequence is copied into a tuple first and every array is held while the
 * engine runs: realising a Tensor may run Python code. */
static PyObject *optim_amp_unscale(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    static const char fname[] = "amp_unscale_";
    needle_state *st = state_of_module(module);
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 3 positional arguments (%zd given)", fname,
                     nargs);
        return NULL;
    }
    double inv_scale;
    if (real_arg(args[2], fname, "inv_scale", &inv_scale) < 0) return NULL;
    if (!PyList_Check(args[0]) && !PyTuple_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "%s: grads must be a list or tuple of arrays, got %.100s",
                     fname, Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    PyObject *grads = PySequence_Tuple(args[0]);
    if (grads == NULL) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(grads);
    /* held[0] is found_inf, held[1 + i] gradient i. */
    PyObject **held = PyMem_Calloc((size_t)count + 1, sizeof *held);
    const nd_array **arrays = PyMem_Calloc((size_t)count + 1, sizeof *arrays);
    PyObject *result = NULL;
    if (held == NULL || arrays == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if ((held[0] = array_of(st, args[1], fname, "found_inf")) == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        char name[48];
        snprintf(name, sizeof name, "gradient %zd", i);
        if ((held[1 + i] = array_of(st, PyTuple_GET_ITEM(grads, i), fname, name)) == NULL)
            goto done;
        arrays[i] = ARRAY(held[1 + i]);
    }
    nd_status status =
        nd_array_amp_unscale(arrays, (int64_t)count, ARRAY(held[0]), (float)inv_scale);
    result = status == ND_OK ? Py_NewRef(Py_None) : raise_status(st, status);
done:
    if (held != NULL)
        for (Py_ssize_t i = 0; i <= count; i++) Py_XDECREF(held[i]);
    PyMem_Free(held);
    PyMem_Free((void *)arrays);
    Py_DECREF(grads);
    return result;
}

PyMethodDef optim_module_functions[] = {
    {"adam_update", (PyCFunction)(void (*)(void))optim_adam_update, METH_FASTCALL,
     "adam_update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step, state=None, "
     "/)\n--\n\n"
     "One fused Adam step of needle.optim.Adam for one parameter: returns the new parameter "
     "(a new NDArray, param's shape) and updates the moments m and v IN PLACE. Arrays are "
     "NDArrays or Tensors of one shape on one device; m and v contiguous, sharing no memory "
     "with the others. step (t >= 1) sets the bias corrections 1 - beta**t. Computes in float64 "
     "when any array is float64, else in float32; the result has param's dtype and m and v "
     "keep theirs. With state (capturable=True: a float64 (2,) array [t, lr] on param's "
     "device) lr and step must be None: the update reads them from state when it runs, so a "
     "CUDA graph can capture it; param is then updated IN PLACE and None is returned."},
    {"adam_count_step", (PyCFunction)optim_adam_count_step, METH_O,
     "adam_count_step(state, /)\n--\n\n"
     "Adds 1 to t in a capturable Adam's state (a float64 (2,) array [t, lr]) on its device: "
     "one single-thread kernel on a GPU, no host synchronisation. Returns None."},
    {"sgd_update", (PyCFunction)(void (*)(void))optim_sgd_update, METH_FASTCALL,
     "sgd_update(param, grad, u, lr, momentum, weight_decay, /)\n--\n\n"
     "One fused step of needle.optim.SGD (the course's dampened momentum) for one parameter: "
     "returns the new parameter (a new NDArray, param's dtype) and updates u IN PLACE. Computes "
     "in float64 when any array is float64, else in float32."},
    {"amp_unscale_", (PyCFunction)(void (*)(void))optim_amp_unscale, METH_FASTCALL,
     "amp_unscale_(grads, found_inf, inv_scale, /)\n--\n\n"
     "GradScaler's unscale (PyTorch's _amp_foreach_non_finite_check_and_unscale_): multiplies "
     "each array in the list or tuple grads (NDArrays or Tensors, any strides; views write "
     "through) IN PLACE by inv_scale and sets found_inf (one element, same device) to 1.0 when "
     "any element was inf or NaN, else leaves it. One pass and, on a GPU, one kernel launch per "
     "gradient, no host synchronisation. Every operand is checked before anything is written."},
    {NULL, NULL, 0, NULL},
};
