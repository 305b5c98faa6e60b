/* registry._newevent: registry.events.NewEvent's constructor, fast path in C.
 *
 * new_event(cls, *args, **kwargs) is installed as NewEvent.__new__. The pure
 * Python NewEvent.__new__ of registry/events.py (kept there as _py_new) is the
 * reference implementation and the slow path: configure() hands it over, with
 * the run-id and event-type caches it fills.
 *
 * The fast path is taken only when the call needs none of the Python logic:
 * cls is the configured class or a subclass; run_id, type, principal given
 * (positionally or by name), at most data and ts_ms besides; run_id an exact
 * str already in the run-id set; type a str (or a str subclass with str's own
 * hash and comparison, such as a StrEnum member) mapped by the type cache to a
 * non-empty plain str; principal an exact str of <= 64 code points (so <= 256
 * UTF-8 bytes); data None (a new {}) or an exact dict; ts_ms None (the wall
 * clock, as time.time_ns() // 1_000_000) or an exact int. The instance is then
 * built as tuple.__new__(cls, fields) builds it. Every other call is passed
 * unchanged to the reference, so it raises (and fills the caches) exactly as
 * the Python does.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>
#include <time.h>

#define NFIELDS 5

typedef struct {
    PyObject *py_new;      /* reference and slow path; NULL until configure() */
    PyObject *valid_ids;   /* set[str] */
    PyObject *valid_types; /* dict[str, str] */
    PyObject *cls;         /* NewEvent: the fast path builds it and its subclasses */
    PyObject *names[NFIELDS]; /* interned "run_id", "type", ... */
} newevent_state;

static inline newevent_state *
get_state(PyObject *module)
{
    return (newevent_state *)PyModule_GetState(module);
}

/* Wall-clock ms exactly as time.time_ns() // 1_000_000 (same clock), or -1 with
 * no exception set when there is no native clock (the caller goes slow). */
static int
now_ms(long long *out)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t ns;
    if (PyTime_Time(&ns) < 0) {
        PyErr_Clear(); /* the slow path raises what time.time_ns() raises */
        return -1;
    }
    /* Floor division, like Python's //, also before 1970. */
    *out = ns / 1000000 - (ns % 1000000 < 0);
    return 0;
#elif defined(CLOCK_REALTIME)
    /* What 3.12's time.time_ns() reads on POSIX. tv_nsec is in [0, 1e9), so
     * this is the floor of ns / 1e6, before 1970 too. */
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return -1;
    }
    *out = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    return 0;
#else
    (void)out;
    return -1;
#endif
}

/* A str the type-cache lookup can hash and compare without running Python code. */
static inline int
plain_str_behaviour(PyObject *op)
{
    PyTypeObject *t = Py_TYPE(op);
    return t == &PyUnicode_Type ||
           (PyUnicode_Check(op) && t->tp_hash == PyUnicode_Type.tp_hash &&
            t->tp_richcompare == PyUnicode_Type.tp_richcompare);
}

PyDoc_STRVAR(new_event_doc,
             "new_event(cls, run_id, type, principal, data=None, ts_ms=None)\n--\n\n"
             "NewEvent.__new__: builds cls from the fields, validated against the caches\n"
             "given to configure(); anything off the fast path is handled by py_new.");

static PyObject *
new_event(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    newevent_state *st = get_state(module);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (st->py_new == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "registry._newevent.configure() has not been called");
        return NULL;
    }
    /* a[0] is cls, a[1..5] the fields by position or name; NULL: not given. */
    PyObject *a[1 + NFIELDS] = {NULL};
    if (nargs < 1 || nargs > 1 + NFIELDS) {
        goto slow;
    }
    memcpy(a, args, (size_t)nargs * sizeof(PyObject *));
    if (kwnames != NULL) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            int i = 0;
            while (i < NFIELDS && name != st->names[i] &&
                   !(PyUnicode_CheckExact(name) && PyUnicode_Compare(name, st->names[i]) == 0)) {
                i++;
            }
            if (i == NFIELDS || a[1 + i] != NULL) {
                goto slow; /* unknown or repeated: the reference's TypeError */
            }
            a[1 + i] = args[nargs + k];
        }
    }
    PyObject *cls = a[0], *run_id = a[1], *type = a[2], *principal = a[3];
    PyObject *data = a[4], *ts_ms = a[5];
    /* Cheap checks first; the cache lookups last, so a lookup that succeeds is
     * not repeated by the slow path. */
    if (run_id == NULL || type == NULL || principal == NULL ||
        !PyUnicode_CheckExact(run_id) || !plain_str_behaviour(type) ||
        !PyUnicode_CheckExact(principal) || PyUnicode_GET_LENGTH(principal) > 64 ||
        (data != NULL && data != Py_None && !PyDict_CheckExact(data)) ||
        (ts_ms != NULL && ts_ms != Py_None && !PyLong_CheckExact(ts_ms)) ||
        (cls != st->cls &&
         !(PyType_Check(cls) && PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)st->cls)))) {
        goto slow;
    }
    long long now = 0;
    if ((ts_ms == NULL || ts_ms == Py_None) && now_ms(&now) < 0) {
        goto slow;
    }
    int known = PySet_Contains(st->valid_ids, run_id);
    if (known <= 0) {
        if (known < 0) {
            return NULL;
        }
        goto slow;
    }
    PyObject *plain_type = PyDict_GetItemWithError(st->valid_types, type); /* borrowed */
    if (plain_type == NULL || !PyUnicode_CheckExact(plain_type) ||
        PyUnicode_GET_LENGTH(plain_type) == 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        goto slow; /* not cached (or a falsy/odd value): `get(type) or _checked_type(type)` */
    }
    plain_type = Py_NewRef(plain_type); /* before allocating: a finalizer may clear the cache */

    data = (data == NULL || data == Py_None) ? PyDict_New() : Py_NewRef(data);
    ts_ms = (ts_ms == NULL || ts_ms == Py_None) ? PyLong_FromLongLong(now) : Py_NewRef(ts_ms);
    /* What tuple.__new__(cls, fields) does for a tuple subclass: tp_alloc, fill,
     * make sure it is GC-tracked. */
    PyObject *self = NULL;
    if (data != NULL && ts_ms != NULL) {
        self = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, NFIELDS);
    }
    if (self == NULL) {
        Py_DECREF(plain_type);
        Py_XDECREF(data);
        Py_XDECREF(ts_ms);
        return NULL;
    }
    PyTuple_SET_ITEM(self, 0, Py_NewRef(run_id));
    PyTuple_SET_ITEM(self, 1, plain_type);
    PyTuple_SET_ITEM(self, 2, Py_NewRef(principal));
    PyTuple_SET_ITEM(self, 3, data);
    PyTuple_SET_ITEM(self, 4, ts_ms);
    if (!PyObject_GC_IsTracked(self)) {
        PyObject_GC_Track(self);
    }
    return self;

slow:
    return PyObject_Vectorcall(st->py_new, args, (size_t)nargs, kwnames);
}

PyDoc_STRVAR(configure_doc,
             "configure(py_new, valid_ids, valid_types, cls, /)\n--\n\n"
             "Set the reference constructor, the caches it fills (an exact set and an\n"
             "exact dict, kept by reference: clear them, never rebind them) and the\n"
             "class (NewEvent) whose subclasses the fast path may build.");

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "configure() takes exactly 4 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "configure(): py_new must be callable");
        return NULL;
    }
    if (!PySet_CheckExact(args[1]) || !PyDict_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(): valid_ids must be a set and valid_types a dict");
        return NULL;
    }
    if (!PyType_Check(args[3]) ||
        !PyType_IsSubtype((PyTypeObject *)args[3], &PyTuple_Type) ||
        (PyTypeObject *)args[3] == &PyTuple_Type) {
        PyErr_SetString(PyExc_TypeError, "configure(): cls must be a tuple subclass");
        return NULL;
    }
    newevent_state *st = get_state(module);
    Py_XSETREF(st->valid_ids, Py_NewRef(args[1]));
    Py_XSETREF(st->valid_types, Py_NewRef(args[2]));
    Py_XSETREF(st->cls, Py_NewRef(args[3]));
    Py_XSETREF(st->py_new, Py_NewRef(args[0])); /* last: marks configured */
    Py_RETURN_NONE;
}

/* -------------------------------------------------------------------- module */

static PyMethodDef newevent_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"new_event", (PyCFunction)(void (*)(void))new_event, METH_FASTCALL | METH_KEYWORDS,
     new_event_doc},
    {NULL, NULL, 0, NULL},
};

static int
newevent_exec(PyObject *module)
{
    static const char *const names[NFIELDS] = {"run_id", "type", "principal", "data", "ts_ms"};
    newevent_state *st = get_state(module);
    for (int i = 0; i < NFIELDS; i++) {
        if ((st->names[i] = PyUnicode_InternFromString(names[i])) == NULL) {
            return -1;
        }
    }
    return 0;
}

static int
newevent_traverse(PyObject *module, visitproc visit, void *arg)
{
    newevent_state *st = get_state(module);
    Py_VISIT(st->py_new);
    Py_VISIT(st->valid_ids);
    Py_VISIT(st->valid_types);
    Py_VISIT(st->cls);
    return 0;
}

static int
newevent_clear(PyObject *module)
{
    newevent_state *st = get_state(module);
    Py_CLEAR(st->py_new);
    Py_CLEAR(st->valid_ids);
    Py_CLEAR(st->valid_types);
    Py_CLEAR(st->cls);
    for (int i = 0; i < NFIELDS; i++) {
        Py_CLEAR(st->names[i]);
    }
    return 0;
}

static void
newevent_free(void *module)
{
    (void)newevent_clear((PyObject *)module);
}

static PyModuleDef_Slot newevent_slots[] = {
    {Py_mod_exec, newevent_exec},
    {0, NULL},
};

PyDoc_STRVAR(newevent_doc,
             "registry.events.NewEvent's constructor, fast path in C: new_event.\n\n"
             "The pure-Python NewEvent.__new__ of registry.events (kept there as _py_new)\n"
             "is the reference implementation and the slow path for every call the fast\n"
             "path does not take. Call configure() once before use; registry.events does\n"
             "so at import.");

static struct PyModuleDef newevent_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "registry._newevent",
    .m_doc = newevent_doc,
    .m_size = sizeof(newevent_state),
    .m_methods = newevent_methods,
    .m_slots = newevent_slots,
    .m_traverse = newevent_traverse,
    .m_clear = newevent_clear,
    .m_free = newevent_free,
};

PyMODINIT_FUNC
PyInit__newevent(void)
{
    return PyModuleDef_Init(&newevent_module);
}
