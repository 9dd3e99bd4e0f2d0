/* config_table.c: the table of NEEDLE_* variables (csrc/config.h) as Python
 * sees it, needle_c._config_table(), which python/needle/_environ.py reads
 * every variable through and tests/test_config_table.py checks README.md and
 * the sources against.
 */
#include "needle_c.h"

#include "config.h"

static PyObject *config_table(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    PyObject *rows = PyTuple_New(ND_CFG_VAR_COUNT);
    if (rows == NULL) return NULL;
    for (int v = 0; v < ND_CFG_VAR_COUNT; v++) {
        const nd_config_row *r = nd_config_row_of((nd_config_var)v);
        PyObject *row =
            Py_BuildValue("(sssLLssss)", r->name, nd_config_section_name(r->section),
                          nd_config_kind_name(r->kind), (long long)r->lo, (long long)r->hi,
                          r->choices, r->default_text, r->accepts, r->doc);
        if (row == NULL) {
            Py_DECREF(rows);
            return NULL;
        }
        PyTuple_SET_ITEM(rows, v, row);
    }
    return rows;
}

PyMethodDef config_module_functions[] = {
    {"_config_table", config_table, METH_NOARGS,
     "_config_table()\n--\n\nThe NEEDLE_* environment variables (csrc/config.h), one tuple each: "
     "(name, section, kind, lo, hi, choices, default, accepts, doc). section: 'run' (read by "
     "needle), 'build' (setup.py) or 'test' (the tests and bench); kind: 'count', 'choice', "
     "'switch', 'number', 'size', 'library', 'capability' or 'list'; lo and hi bound a count; "
     "choices: a choice's words separated by '|'."},
    {NULL, NULL, 0, NULL},
};
