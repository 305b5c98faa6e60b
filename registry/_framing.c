/* registry._framing: the WAL record framing's hot path in C.
 *
 * Two functions of registry/record.py, byte for byte and error for error:
 * encode_body() and encode_frames(). The Python functions there are the
 * reference and the slow path: configure() hands them over, and every call the
 * fast path does not take is passed to them unchanged, so the results and
 * errors are the Python ones. The layouts are described in registry/record.py.
 *
 * Nothing here is a second implementation of a library: the JSON is orjson's
 * (the configured dumps, called as the reference calls it) and the CRC32C is
 * the crc32c package's (the configured callable, once per frame). What is in C
 * is the glue around them, which costs more than they do in Python.
 *
 * Keyword arguments and other argument counts always go to the reference.
 *
 * encode_body(event, max_record_bytes) takes the fast path when: event is a
 * tuple of 5; run_id, type and principal are exact str with a UTF-8 form;
 * ts_ms an exact int in int64 range; each text field at most 65535 bytes;
 * max_record_bytes an exact int; dumps(data, None, option) returns bytes
 * without "null" in them (the reference then decides: a None, or a NaN that
 * orjson wrote as null); the frame fits the limit. dumps raising a TypeError
 * (orjson.JSONEncodeError is one) also goes slow; any other error propagates,
 * as it does from the reference.
 *
 * encode_frames(first_seq, bodies) takes the fast path when first_seq is an
 * exact int and bodies an exact list of exact bytes whose seqs all fit in 64
 * bits and whose frames fit their 32-bit lengths.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define BODY_HEADER_SIZE 14 /* "<qHHH" */
#define FRAME_HEADER_SIZE 8 /* "<II" */
#define SEQ_SIZE 8          /* "<Q" */
#define FRAME_OVERHEAD (FRAME_HEADER_SIZE + SEQ_SIZE)

typedef struct {
    PyObject *py_encode_body;   /* reference and slow path; NULL until configure() */
    PyObject *py_encode_frames; /* reference and slow path */
    PyObject *dumps;            /* orjson.dumps */
    PyObject *dumps_option;     /* the int option the reference passes */
    PyObject *crc32c;           /* crc32c.crc32c */
} framing_state;

static inline framing_state *
get_state(PyObject *module)
{
    return (framing_state *)PyModule_GetState(module);
}

static framing_state *
configured_state(PyObject *module)
{
    framing_state *st = get_state(module);
    if (st->py_encode_body == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "registry._framing.configure() has not been called");
        return NULL;
    }
    return st;
}

static void
put_le(unsigned char *p, uint64_t v, int size)
{
    for (int i = 0; i < size; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* Whether "null" occurs in p[0:n]. */
static int
has_null(const char *p, Py_ssize_t n)
{
    const char *end = p + n;
    while (end - p >= 4) {
        const char *hit = memchr(p, 'n', (size_t)(end - p - 3));
        if (hit == NULL) {
            return 0;
        }
        if (memcmp(hit, "null", 4) == 0) {
            return 1;
        }
        p = hit + 1;
    }
    return 0;
}

/* The UTF-8 of an exact str, or NULL (no exception set) when the reference must
 * decide: another type, or no UTF-8 form (a lone surrogate). */
static const char *
plain_utf8(PyObject *s, Py_ssize_t *n)
{
    if (!PyUnicode_CheckExact(s)) {
        return NULL;
    }
    const char *p = PyUnicode_AsUTF8AndSize(s, n);
    if (p == NULL) {
        PyErr_Clear();
    }
    return p;
}

PyDoc_STRVAR(encode_body_doc,
             "encode_body(event, max_record_bytes=DEFAULT_MAX_RECORD_BYTES)\n\n"
             "Same bytes and errors as the reference, registry.record._py_encode_body.");

static PyObject *
framing_encode_body(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    framing_state *st = configured_state(module);
    if (st == NULL) {
        return NULL;
    }
    if (kwnames != NULL || nargs != 2 || !PyTuple_Check(args[0]) ||
        PyTuple_GET_SIZE(args[0]) != 5 || !PyLong_CheckExact(args[1])) {
        goto slow;
    }
    PyObject *event = args[0];
    const char *text[3];
    Py_ssize_t lens[3];
    for (int i = 0; i < 3; i++) { /* run_id, type, principal */
        text[i] = plain_utf8(PyTuple_GET_ITEM(event, i), &lens[i]);
        if (text[i] == NULL || lens[i] > 0xFFFF) {
            goto slow;
        }
    }
    PyObject *ts = PyTuple_GET_ITEM(event, 4);
    int overflow = 1;
    long long ts_ms = PyLong_CheckExact(ts) ? PyLong_AsLongLongAndOverflow(ts, &overflow) : 0;
    if (overflow) {
        goto slow;
    }
    long long limit = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow < 0) {
        goto slow; /* below any size: the reference raises EventTooLargeError */
    }
    PyObject *dumps_args[3] = {PyTuple_GET_ITEM(event, 3), Py_None, st->dumps_option};
    PyObject *dumps = Py_NewRef(st->dumps); /* configure() may run while it does */
    PyObject *json = PyObject_Vectorcall(dumps, dumps_args, 3, NULL);
    Py_DECREF(dumps);
    if (json == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            goto slow;
        }
        return NULL;
    }
    if (!PyBytes_CheckExact(json) || has_null(PyBytes_AS_STRING(json), PyBytes_GET_SIZE(json))) {
        Py_DECREF(json);
        goto slow;
    }
    Py_ssize_t json_len = PyBytes_GET_SIZE(json);
    /* Each part is a live object, so the sum cannot overflow Py_ssize_t. */
    Py_ssize_t size = BODY_HEADER_SIZE + lens[0] + lens[1] + lens[2] + json_len;
    if (!overflow && (long long)(FRAME_OVERHEAD + size) > limit) {
        Py_DECREF(json);
        goto slow; /* the reference raises EventTooLargeError */
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (result != NULL) {
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
        put_le(out, (uint64_t)ts_ms, 8);
        for (int i = 0; i < 3; i++) {
            put_le(out + 8 + 2 * i, (uint64_t)lens[i], 2);
        }
        out += BODY_HEADER_SIZE;
        for (int i = 0; i < 3; i++) {
            memcpy(out, text[i], (size_t)lens[i]);
            out += lens[i];
        }
        memcpy(out, PyBytes_AS_STRING(json), (size_t)json_len);
    }
    Py_DECREF(json);
    return result;

slow:;
    PyObject *reference = Py_NewRef(st->py_encode_body);
    PyObject *answer = PyObject_Vectorcall(reference, args, (size_t)nargs, kwnames);
    Py_DECREF(reference);
    return answer;
}

/* crc32c(out[0:n]) through the configured callable, into *crc. */
static int
checksum(framing_state *st, unsigned char *out, Py_ssize_t n, uint32_t *crc)
{
    PyObject *view = PyMemoryView_FromMemory((char *)out, n, PyBUF_READ);
    if (view == NULL) {
        return -1;
    }
    PyObject *crc32c = Py_NewRef(st->crc32c);
    PyObject *value = PyObject_CallOneArg(crc32c, view);
    Py_DECREF(crc32c);
    /* The view points into a bytes object still being built: nobody may keep it. */
    int kept = Py_REFCNT(view) != 1;
    Py_DECREF(view);
    if (value == NULL) {
        return -1;
    }
    unsigned long v = PyLong_Check(value) ? PyLong_AsUnsignedLong(value) : (unsigned long)-1;
    Py_DECREF(value);
    if (kept || v > 0xFFFFFFFFul) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_SystemError,
                            kept ? "crc32c kept the view of an unfinished frame"
                                 : "crc32c returned something other than a 32-bit int");
        }
        return -1;
    }
    *crc = (uint32_t)v;
    return 0;
}

PyDoc_STRVAR(encode_frames_doc,
             "encode_frames(first_seq, bodies)\n\n"
             "Same bytes and errors as the reference, registry.record._py_encode_frames.");

static PyObject *
framing_encode_frames(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    framing_state *st = configured_state(module);
    if (st == NULL) {
        return NULL;
    }
    if (kwnames != NULL || nargs != 2 || !PyLong_CheckExact(args[0]) ||
        !PyList_CheckExact(args[1])) {
        goto slow;
    }
    unsigned long long seq0 = PyLong_AsUnsignedLongLong(args[0]);
    if (seq0 == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or past 64 bits: the reference's struct.error */
        goto slow;
    }
    /* No Python code runs until the CRCs: the list cannot change meanwhile. */
    PyObject *bodies = args[1];
    Py_ssize_t count = PyList_GET_SIZE(bodies);
    if (count > 0 && UINT64_MAX - seq0 < (unsigned long long)(count - 1)) {
        goto slow;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i);
        if (!PyBytes_CheckExact(body)) {
            goto slow;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(body);
        if ((size_t)n > (size_t)UINT32_MAX - SEQ_SIZE ||
            n > PY_SSIZE_T_MAX - FRAME_OVERHEAD - total) {
            goto slow;
        }
        total += FRAME_OVERHEAD + n;
    }
    /* The bodies are held by new references: the CRC callable is Python code. */
    PyObject *held = PyList_GetSlice(bodies, 0, count);
    if (held == NULL) {
        return NULL;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        Py_DECREF(held);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = PyList_GET_ITEM(held, i);
        Py_ssize_t n = PyBytes_GET_SIZE(body);
        uint32_t crc;
        put_le(out + FRAME_HEADER_SIZE, seq0 + (unsigned long long)i, SEQ_SIZE);
        memcpy(out + FRAME_OVERHEAD, PyBytes_AS_STRING(body), (size_t)n);
        if (checksum(st, out + FRAME_HEADER_SIZE, SEQ_SIZE + n, &crc) < 0) {
            Py_DECREF(result);
            Py_DECREF(held);
            return NULL;
        }
        put_le(out, (uint64_t)n + SEQ_SIZE, 4);
        put_le(out + 4, crc, 4);
        out += FRAME_OVERHEAD + n;
    }
    Py_DECREF(held);
    return result;

slow:;
    PyObject *reference = Py_NewRef(st->py_encode_frames);
    PyObject *answer = PyObject_Vectorcall(reference, args, (size_t)nargs, kwnames);
    Py_DECREF(reference);
    return answer;
}

PyDoc_STRVAR(configure_doc,
             "configure(py_encode_body, py_encode_frames, dumps, dumps_option, crc32c, /)\n--\n\n"
             "Set the references (and slow paths), orjson's dumps with the option the\n"
             "reference passes it, and the crc32c callable.");

static PyObject *
framing_configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "configure() takes exactly 5 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyCallable_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2]) ||
        !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(): the references, dumps and crc32c must be callable");
        return NULL;
    }
    if (!PyLong_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "configure(): dumps_option must be an int");
        return NULL;
    }
    framing_state *st = get_state(module);
    Py_XSETREF(st->py_encode_frames, Py_NewRef(args[1]));
    Py_XSETREF(st->dumps, Py_NewRef(args[2]));
    Py_XSETREF(st->dumps_option, Py_NewRef(args[3]));
    Py_XSETREF(st->crc32c, Py_NewRef(args[4]));
    Py_XSETREF(st->py_encode_body, Py_NewRef(args[0])); /* last: marks configured */
    Py_RETURN_NONE;
}

/* -------------------------------------------------------------------- module */

static PyMethodDef framing_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))framing_configure, METH_FASTCALL, configure_doc},
    {"encode_body", (PyCFunction)(void (*)(void))framing_encode_body,
     METH_FASTCALL | METH_KEYWORDS, encode_body_doc},
    {"encode_frames", (PyCFunction)(void (*)(void))framing_encode_frames,
     METH_FASTCALL | METH_KEYWORDS, encode_frames_doc},
    {NULL, NULL, 0, NULL},
};

static int
framing_traverse(PyObject *module, visitproc visit, void *arg)
{
    framing_state *st = get_state(module);
    Py_VISIT(st->py_encode_body);
    Py_VISIT(st->py_encode_frames);
    Py_VISIT(st->dumps);
    Py_VISIT(st->dumps_option);
    Py_VISIT(st->crc32c);
    return 0;
}

static int
framing_clear(PyObject *module)
{
    framing_state *st = get_state(module);
    Py_CLEAR(st->py_encode_body);
    Py_CLEAR(st->py_encode_frames);
    Py_CLEAR(st->dumps);
    Py_CLEAR(st->dumps_option);
    Py_CLEAR(st->crc32c);
    return 0;
}

static void
framing_free(void *module)
{
    (void)framing_clear((PyObject *)module);
}

PyDoc_STRVAR(framing_doc,
             "The WAL record framing's hot path in C: encode_body and encode_frames.\n\n"
             "The pure-Python functions of registry.record are the reference and the slow\n"
             "path for every call the fast path does not take. Call configure() once\n"
             "before use; registry.record does so at import.");

static struct PyModuleDef framing_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "registry._framing",
    .m_doc = framing_doc,
    .m_size = sizeof(framing_state),
    .m_methods = framing_methods,
    .m_traverse = framing_traverse,
    .m_clear = framing_clear,
    .m_free = framing_free,
};

PyMODINIT_FUNC
PyInit__framing(void)
{
    return PyModuleDef_Init(&framing_module);
}
