/* A CPython extension with a refcount bug, for the leak-attribution tests
 * (tests/test_diagnosis_native.py) and benchmarks/bench_plugin_peers.py: mr_refleak.make(n)
 * returns a new bytes object of n bytes with one reference too many, so it is never freed.
 *
 * Built by both: cc -O1 -shared -fPIC -I<Python include> -o mr_refleak<EXT_SUFFIX> mr_refleak.c
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
static PyObject *make(PyObject *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "size must be >= 0");
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, n);
    if (bytes == NULL)
        return NULL;
    memset(PyBytes_AS_STRING(bytes), 1, (size_t)n);
    Py_INCREF(bytes); /* the bug: a reference taken and never given back */
    return bytes;
}
static PyMethodDef methods[] = {{"make", make, METH_O, "a bytes object, leaked"}, {NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "mr_refleak", NULL, -1, methods};
PyMODINIT_FUNC PyInit_mr_refleak(void)
{
    return PyModule_Create(&module);
}
