/* cpu_info.c: the CPU kernels' settings as Python sees them: which
 * instruction set they run (NEEDLE_CPU_ISA), where matmul splits between
 * needle's GEMM and the BLAS (NEEDLE_GEMM_SPLIT), and _cpu_kernels(), the
 * report benchmarks print in their headers.
 *
 * The choices themselves live in the engine (csrc/cpu/cpu_isa.c, cpu_matmul.c);
 * this file only reads the environment at import, converts, and reports.
 */
#include "needle_c.h"
#include "runtime.h"

#include <string.h>

#include "config.h"

/* Applies NEEDLE_CPU_ISA and NEEDLE_GEMM_SPLIT at import. A value that names
 * nothing (an unknown instruction set, a split that is not a count) is a
 * ValueError, so that `import needle_c` fails with it; an instruction set this
 * CPU lacks is refused with a RuntimeWarning and the best one it runs is used
 * (the same setting is right on another machine). -1 with an exception set on
 * failure. */
int cpu_settings_install(void) {
    static const char *const isa_words[] = {"avx512", "avx2", "baseline"}; /* the table's order */
    int word = 0;
    int set = nd_config_choice(ND_CFG_CPU_ISA, &word);
    if (set < 0) {
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        return -1;
    }
    if (set == 1) {
        nd_cpu_isa isa;
        if (nd_cpu_isa_from_name(isa_words[word], &isa) != ND_OK) {
            PyErr_SetString(PyExc_SystemError, nd_last_error()); /* the table and the engine */
            return -1;
        }
        if (nd_cpu_set_isa(isa) != ND_OK &&
            PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "NEEDLE_CPU_ISA=%s ignored: %s; using %s",
                             isa_words[word], nd_last_error(),
                             nd_cpu_isa_name(nd_cpu_isa_current())) < 0)
            return -1;
    }
    int64_t split = 0;
    set = nd_config_count(ND_CFG_GEMM_SPLIT, &split);
    if (set < 0) {
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        return -1;
    }
    if (set == 1) nd_cpu_set_gemm_split(split);
    return 0;
}

static int set_item(PyObject *dict, const char *key, PyObject *value) {
    if (value == NULL) return -1;
    int rc = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *calibration_dict(const nd_gemm_calibration *c) {
    if (!c->measured) Py_RETURN_NONE;
    PyObject *sizes = PyList_New(0), *d = PyDict_New();
    if (sizes == NULL || d == NULL) goto fail;
    for (int i = 0; i < c->count; i++) {
        PyObject *row = Py_BuildValue("{s:L,s:d,s:d}", "size", (long long)c->size[i], "needle_s",
                                      c->needle_seconds[i], "blas_s", c->blas_seconds[i]);
        if (row == NULL || PyList_Append(sizes, row) < 0) {
            Py_XDECREF(row);
            goto fail;
        }
        Py_DECREF(row);
    }
    if (set_item(d, "isa", PyUnicode_FromString(nd_cpu_isa_name(c->isa))) < 0 ||
        set_item(d, "split", PyLong_FromLongLong((long long)c->split)) < 0 ||
        set_item(d, "cut_short", PyBool_FromLong(c->cut_short)) < 0 ||
        PyDict_SetItemString(d, "sizes", sizes) < 0)
        goto fail;
    Py_DECREF(sizes);
    return d;
fail:
    Py_XDECREF(sizes);
    Py_XDECREF(d);
    return NULL;
}

/* The dtypes whose linear layers' gradients take one pass now, as a list. */
static PyObject *one_pass_dtypes(void) {
    PyObject *list = PyList_New(0);
    const nd_dtype narrow[] = {ND_FLOAT16, ND_BFLOAT16};
    for (int i = 0; list != NULL && i < 2; i++) {
        if (!nd_cpu_linear_grads_in_one_pass(narrow[i])) continue;
        PyObject *name = PyUnicode_FromString(nd_dtype_name(narrow[i]));
        if (name == NULL || PyList_Append(list, name) < 0) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *cpu_kernels(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    PyObject *d = PyDict_New(), *supported = PyList_New(0);
    if (d == NULL || supported == NULL) goto fail;
    for (int i = 0; i < ND_CPU_ISA_COUNT; i++) {
        if (!nd_cpu_isa_supported((nd_cpu_isa)i)) continue;
        PyObject *name = PyUnicode_FromString(nd_cpu_isa_name((nd_cpu_isa)i));
        if (name == NULL || PyList_Append(supported, name) < 0) {
            Py_XDECREF(name);
            goto fail;
        }
        Py_DECREF(name);
    }
    char forced[64];
    if (nd_config_text(ND_CFG_CPU_ISA, forced, sizeof forced) < 0) forced[0] = '\0';
    int64_t split = nd_cpu_gemm_split();
    nd_cpu_isa isa = nd_cpu_isa_current();
    if (set_item(d, "isa", PyUnicode_FromString(nd_cpu_isa_name(isa))) < 0 ||
        set_item(d, "best", PyUnicode_FromString(nd_cpu_isa_name(nd_cpu_isa_best()))) < 0 ||
        PyDict_SetItemString(d, "supported", supported) < 0 ||
        set_item(d, "env", forced[0] ? PyUnicode_FromString(forced) : Py_NewRef(Py_None)) < 0 ||
        set_item(d, "gemm", PyUnicode_FromString(nd_cpu_gemm_kernel_name(isa))) < 0 ||
        set_item(d, "gemm_bfloat16",
                 PyUnicode_FromString(nd_cpu_gemm_narrow_kernel_name(ND_BFLOAT16))) < 0 ||
        set_item(d, "gemm_float16",
                 PyUnicode_FromString(nd_cpu_gemm_narrow_kernel_name(ND_FLOAT16))) < 0 ||
        set_item(d, "linear_grads_one_pass", one_pass_dtypes()) < 0 ||
        set_item(d, "elementwise", PyUnicode_FromString(nd_cpu_isa_name(isa))) < 0 ||
        set_item(d, "blas", PyUnicode_FromString(needle_rt.blas.description)) < 0 ||
        set_item(d, "gemm_split",
                 split < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong((long long)split)) < 0 ||
        set_item(d, "calibration", calibration_dict(nd_cpu_gemm_last_calibration())) < 0)
        goto fail;
    Py_DECREF(supported);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(supported);
    return NULL;
}

/* The ISA named by a Python str; -1 with an exception set otherwise. */
static int isa_arg(PyObject *module, const char *func, PyObject *arg, nd_cpu_isa *isa) {
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a str, got %.100s", func,
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL) return -1;
    nd_status status = nd_cpu_isa_from_name(name, isa);
    if (status != ND_OK) {
        raise_status(state_of_module(module), status);
        return -1;
    }
    return 0;
}

static PyObject *set_cpu_isa(PyObject *module, PyObject *arg) {
    nd_cpu_isa isa;
    if (isa_arg(module, "_set_cpu_isa", arg, &isa) < 0) return NULL;
    nd_status status = nd_cpu_set_isa(isa);
    if (status != ND_OK) return raise_status(state_of_module(module), status);
    Py_RETURN_NONE;
}

static PyObject *limit_cpu_isa(PyObject *module, PyObject *arg) {
    nd_cpu_isa isa;
    if (isa_arg(module, "_limit_cpu_isa", arg, &isa) < 0) return NULL;
    nd_status status = nd_cpu_isa_limit(isa);
    if (status != ND_OK) return raise_status(state_of_module(module), status);
    Py_RETURN_NONE;
}

static PyObject *set_gemm_split(PyObject *module, PyObject *arg) {
    (void)module;
    if (arg == Py_None) {
        nd_cpu_set_gemm_split(-1);
        Py_RETURN_NONE;
    }
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "_set_gemm_split: expected an int or None, got %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    long long value = PyLong_AsLongLong(arg);
    if (value == -1 && PyErr_Occurred()) return NULL;
    if (value < 0) {
        PyErr_Format(PyExc_ValueError, "_set_gemm_split: expected a count >= 0, got %lld", value);
        return NULL;
    }
    nd_cpu_set_gemm_split((int64_t)value);
    Py_RETURN_NONE;
}

static PyObject *calibrate_gemm(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    nd_gemm_calibration report;
    nd_status status = nd_cpu_gemm_calibrate(&report);
    if (status != ND_OK) return raise_status(state_of_module(module), status);
    return calibration_dict(&report);
}

PyMethodDef cpu_info_module_functions[] = {
    {"_cpu_kernels", cpu_kernels, METH_NOARGS,
     "_cpu_kernels()\n--\n\nWhich CPU kernels run, as a dict: 'isa' (now), 'best' (the best "
     "this CPU runs), 'supported', 'env' (NEEDLE_CPU_ISA), 'gemm' (needle's micro-kernel), "
     "'elementwise' (the ISA of the elementwise and reduction loops), "
     "'linear_grads_one_pass' (the dtypes whose linear layers' gradients take one pass over the "
     "output's gradient), 'blas', 'gemm_split' "
     "(multiply-adds from which matmul uses the BLAS; None until measured) and 'calibration' "
     "(what the last measurement found, or None)."},
    {"_set_cpu_isa", set_cpu_isa, METH_O,
     "_set_cpu_isa(name, /)\n--\n\nMakes the CPU kernels use 'avx512', 'avx2' or 'baseline'; "
     "ValueError for a name this CPU cannot run."},
    {"_limit_cpu_isa", limit_cpu_isa, METH_O,
     "_limit_cpu_isa(name, /)\n--\n\nTreats this CPU as running nothing above `name` for the rest "
     "of the process (emulates a lesser machine; never raises what the CPU has)."},
    {"_set_gemm_split", set_gemm_split, METH_O,
     "_set_gemm_split(min_madds, /)\n--\n\nProducts of at least min_madds multiply-adds go to "
     "the BLAS; None measures the split again at the next product that could go either way."},
    {"_calibrate_gemm", calibrate_gemm, METH_NOARGS,
     "_calibrate_gemm()\n--\n\nMeasures needle's GEMM against the BLAS now, sets the split and "
     "returns what was measured (a dict); ValueError without a BLAS."},
    {NULL, NULL, 0, NULL},
};
