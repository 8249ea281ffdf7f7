#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#define DS_MAX_ARGS 32
#define DS_MAX_DIMS 8
#define DS_SLOT (3 + DS_MAX_DIMS)
typedef int (*ds_entry_fn)(void *const *ptrs, const int64_t *shapes);

/* invoke(entry_address, *arrays): C-contiguous buffers in, entry(ptrs, shapes) called with the GIL released.
   shapes holds, per array, DS_SLOT int64s: ndim, itemsize, format char, then DS_MAX_DIMS dims.
   Returns the entry's int status; 0 = success. */
static PyObject *invoke(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 1 || nargs > DS_MAX_ARGS + 1) {
        PyErr_SetString(PyExc_TypeError, "invoke(entry, *arrays)");
        return NULL;
    }
    ds_entry_fn fn = (ds_entry_fn)PyLong_AsVoidPtr(args[0]);
    if (fn == NULL) return NULL;
    Py_buffer views[DS_MAX_ARGS];
    void *ptrs[DS_MAX_ARGS];
    int64_t shapes[DS_MAX_ARGS * DS_SLOT];
    Py_ssize_t n = nargs - 1, got = 0;
    for (; got < n; got++) {
        Py_buffer *v = &views[got];
        if (PyObject_GetBuffer(args[got + 1], v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
        if (v->ndim > DS_MAX_DIMS) { PyBuffer_Release(v); PyErr_SetString(PyExc_ValueError, "rank > 8"); goto fail; }
        ptrs[got] = v->buf;
        int64_t *s = shapes + got * DS_SLOT;
        const char *f = v->format ? v->format : "B";
        if (*f == '<' || *f == '=' || *f == '@') f++;
        s[0] = v->ndim;
        s[1] = v->itemsize;
        s[2] = *f;
        for (int d = 0; d < v->ndim; d++) s[d + 3] = v->shape[d];
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(ptrs, shapes);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) PyBuffer_Release(&views[i]);
    return PyLong_FromLong(rc);
fail:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    return NULL;
}

static PyMethodDef methods[] = {{"invoke", (PyCFunction)(void (*)(void))invoke, METH_FASTCALL, NULL},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "ds_trampoline", NULL, -1, methods, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit_ds_trampoline(void) { return PyModule_Create(&mod); }
