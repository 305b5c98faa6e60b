/* registry._walcodec: the WAL record codec's hot path in C.
 *
 * Two functions of registry/record.py, byte for byte and error for error:
 * encode_body() and encode_frames(). registry/record.py is the reference
 * implementation (and the fallback where this module cannot be built); the
 * layouts are described there.
 *
 * encode_body() writes the event's JSON itself when ``data`` is a flat dict of
 * plain str keys and plain str/int/float/bool/None values whose strings need no
 * JSON escaping; anything else goes to the ``json_fallback`` given to
 * configure(). Envelope oddities (a ts_ms that is not a plain int in int64
 * range, a length over 65535, a non-str field) go through struct.pack or
 * str.encode, so they raise what the reference raises.
 *
 * encode_frames() computes CRC32C natively (SSE4.2 when the CPU has it, else
 * slicing-by-8 tables); configure() checks both against the ``crc32c``
 * callable and refuses to configure on any disagreement.
 */

#if defined(__FAST_MATH__)
#error "short_float_repr needs exact IEEE arithmetic: do not build with -ffast-math"
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BODY_HEADER_SIZE 14 /* "<qHHH" */
#define FRAME_HEADER_SIZE 8 /* "<II" */
#define SEQ_SIZE 8          /* "<Q" */
#define FRAME_OVERHEAD (FRAME_HEADER_SIZE + SEQ_SIZE)

/* ------------------------------------------------------------------ CRC32C */

static uint32_t crc_table[8][256];

static void
crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc_table[0][i] = c;
    }
    for (int i = 0; i < 256; i++) {
        for (int t = 1; t < 8; t++) {
            uint32_t prev = crc_table[t - 1][i];
            crc_table[t][i] = (prev >> 8) ^ crc_table[0][prev & 0xff];
        }
    }
}

static inline uint32_t
load_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* Raw CRC register update (no pre/post inversion). */
static uint32_t
crc_update_table(uint32_t c, const unsigned char *p, size_t n)
{
    while (n >= 8) {
        uint32_t lo = c ^ load_le32(p), hi = load_le32(p + 4);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) {
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    }
    return c;
}

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_CRC_SSE42 1
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t
crc_update_sse42(uint32_t c, const unsigned char *p, size_t n)
{
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c64 = _mm_crc32_u64(c64, word);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--) {
        c = _mm_crc32_u8(c, *p++);
    }
    return c;
}
#endif

typedef uint32_t (*crc_update_fn)(uint32_t, const unsigned char *, size_t);
static crc_update_fn crc_update = crc_update_table;

/* ------------------------------------------------------------ module state */

typedef struct {
    PyObject *invalid_event_error;
    PyObject *too_large_error;
    PyObject *json_fallback;
    PyObject *crc32c;
    PyObject *struct_pack; /* struct.pack: the reference's exact errors */
} walcodec_state;

static inline walcodec_state *
get_state(PyObject *module)
{
    return (walcodec_state *)PyModule_GetState(module);
}

static walcodec_state *
configured_state(PyObject *module)
{
    walcodec_state *st = get_state(module);
    if (st->json_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "registry._walcodec.configure() has not been called");
        return NULL;
    }
    return st;
}

/* ------------------------------------------------------------- byte buffer */

typedef struct {
    char *data; /* stack or a PyMem block */
    Py_ssize_t len, cap;
    char stack[512];
} Buf;

static void
buf_init(Buf *b)
{
    b->data = b->stack;
    b->len = 0;
    b->cap = (Py_ssize_t)sizeof(b->stack);
}

static void
buf_free(Buf *b)
{
    if (b->data != b->stack) {
        PyMem_Free(b->data);
    }
}

static int
buf_grow(Buf *b, Py_ssize_t extra)
{
    if (extra > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t cap = Py_MAX(b->cap * 2, b->len + extra);
    char *p;
    if (b->data == b->stack) {
        p = PyMem_Malloc((size_t)cap);
        if (p != NULL) {
            memcpy(p, b->stack, (size_t)b->len);
        }
    }
    else {
        p = PyMem_Realloc(b->data, (size_t)cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

static inline int
buf_reserve(Buf *b, Py_ssize_t extra)
{
    return extra <= b->cap - b->len ? 0 : buf_grow(b, extra);
}

static inline void
buf_put(Buf *b, const char *s, Py_ssize_t n)
{
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
}

/* ------------------------------------------------------------ JSON fast path */

/* A plain str whose JSON form is itself in quotes: printable ASCII, no '"' or
 * '\\' (S_CHAR in CPython's Modules/_json.c). */
static int
plain_json_str(PyObject *s, const char **p, Py_ssize_t *n)
{
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s)) {
        return 0;
    }
    const unsigned char *c = PyUnicode_1BYTE_DATA(s);
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    for (Py_ssize_t i = 0; i < len; i++) {
        if (c[i] < ' ' || c[i] > '~' || c[i] == '"' || c[i] == '\\') {
            return 0;
        }
    }
    *p = (const char *)c;
    *n = len;
    return 1;
}

/* Append ``"s"`` after reserving ``room`` bytes more than it needs. */
static int
put_json_str(Buf *b, const char *s, Py_ssize_t n, Py_ssize_t room)
{
    if (buf_reserve(b, n + 2 + room) < 0) {
        return -1;
    }
    b->data[b->len++] = '"';
    buf_put(b, s, n);
    b->data[b->len++] = '"';
    return 0;
}

/* Write u in decimal, at least min_digits long (zero padded), ending just
 * before end; return where it starts. */
static char *
put_digits(char *end, unsigned long long u, int min_digits)
{
    char *start = end - min_digits;
    do {
        *--end = (char)('0' + u % 10);
        u /= 10;
    } while (u || end > start);
    return end;
}

/* float.__repr__ of x into out[32] for the common case, else 0 (then use
 * PyOS_double_to_string, which costs ~250 ns in dtoa).
 *
 * Handles 1e-4 <= |x| < 1e15 (repr's fixed notation) with at most 15
 * significant digits: the smallest k with round(|x| * 10**k) = m <= 1e15 and
 * m / 10**k == |x| gives repr's digits. Why: m and 10**k are exact doubles and
 * IEEE division rounds correctly, so "m e-k" reads back as x; 1/m >= 1e-15
 * exceeds the relative width of x's rounding interval (2**-52), so at most one
 * m per k reads back as x, and |x * 10**k - m| <= 0.23 then, so rounding the
 * product finds it; the smallest such k is the shortest string, which is what
 * repr (dtoa mode 0) produces. */
static Py_ssize_t
short_float_repr(double x, char *out)
{
#if FLT_EVAL_METHOD == 0
    static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
                                   1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17,
                                   1e18, 1e19};
    double ax = fabs(x);
    if (!(ax >= 1e-4 && ax < 1e15)) {
        return 0;
    }
    for (int k = 0; k < (int)(sizeof(pow10) / sizeof(pow10[0])); k++) {
        double m = (double)(long long)(ax * pow10[k] + 0.5); /* floor: positive, < 2**63 */
        if (m > 1e15) {
            return 0;
        }
        if (m / pow10[k] != ax) {
            continue;
        }
        unsigned long long digits = (unsigned long long)m, scale = 1;
        for (int i = 0; i < k; i++) {
            scale *= 10;
        }
        char tmp[48], *end = tmp + sizeof(tmp), *q;
        q = k ? put_digits(end, digits % scale, k) : put_digits(end, 0, 1);
        *--q = '.';
        q = put_digits(q, digits / scale, 1);
        if (x < 0) {
            *--q = '-';
        }
        memcpy(out, q, (size_t)(end - q));
        return end - q;
    }
#else
    (void)x;
    (void)out;
#endif
    return 0;
}

static int
put_json_value(Buf *b, PyObject *v)
{
    const char *s;
    Py_ssize_t n;
    char digits[32];

    if (v == Py_True || v == Py_False || v == Py_None) {
        s = v == Py_True ? "true" : v == Py_False ? "false" : "null";
        n = (Py_ssize_t)strlen(s);
    }
    else if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) {
            return 0; /* int.__repr__ may refuse it (max_str_digits) */
        }
        char *end = digits + sizeof(digits);
        char *q = put_digits(end, x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x, 1);
        if (x < 0) {
            *--q = '-';
        }
        s = q;
        n = end - q;
    }
    else if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        if (!isfinite(x)) {
            return 0;
        }
        s = digits;
        n = short_float_repr(x, digits);
        if (n) {
            goto put;
        }
        /* Exactly float.__repr__, which json uses for finite floats. */
        char *r = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (r == NULL) {
            return -1;
        }
        n = (Py_ssize_t)strlen(r);
        int rc = buf_reserve(b, n);
        if (rc == 0) {
            buf_put(b, r, n);
        }
        PyMem_Free(r);
        return rc < 0 ? -1 : 1;
    }
    else if (plain_json_str(v, &s, &n)) {
        return put_json_str(b, s, n, 0) < 0 ? -1 : 1;
    }
    else {
        return 0;
    }
put:
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    buf_put(b, s, n);
    return 1;
}

/* JSON of ``data`` into ``b``: 1 done, 0 not a fast-path case, -1 error. Runs
 * no Python code, so the dict cannot change under PyDict_Next. */
static int
json_fast(Buf *b, PyObject *data)
{
    if (!PyDict_CheckExact(data)) {
        return 0;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    const char *k;
    Py_ssize_t kn;
    char sep = '{';
    while (PyDict_Next(data, &pos, &key, &value)) {
        if (!plain_json_str(key, &k, &kn)) {
            return 0;
        }
        if (buf_reserve(b, 1) < 0) {
            return -1;
        }
        b->data[b->len++] = sep;
        sep = ',';
        if (put_json_str(b, k, kn, 1) < 0) {
            return -1;
        }
        b->data[b->len++] = ':';
        int rc = put_json_value(b, value);
        if (rc <= 0) {
            return rc;
        }
    }
    if (buf_reserve(b, 2) < 0) {
        return -1;
    }
    if (sep == '{') {
        b->data[b->len++] = '{';
    }
    b->data[b->len++] = '}';
    return 1;
}

/* The reference's ``except (TypeError, ValueError, RecursionError) as exc:
 * raise InvalidEventError(f"event data is not serializable JSON: {exc}") from exc``. */
static void
raise_invalid_data(walcodec_state *st)
{
    if (!PyErr_ExceptionMatches(PyExc_TypeError) &&
        !PyErr_ExceptionMatches(PyExc_ValueError) &&
        !PyErr_ExceptionMatches(PyExc_RecursionError)) {
        return;
    }
    PyObject *exc = PyErr_GetRaisedException();
    PyObject *cls = Py_NewRef(st->invalid_event_error); /* Python code runs below */
    PyObject *text = PyObject_Format(exc, NULL);
    PyObject *msg = text ? PyUnicode_FromFormat("event data is not serializable JSON: %U", text)
                         : NULL;
    PyObject *err = msg ? PyObject_CallOneArg(cls, msg) : NULL;
    Py_DECREF(cls);
    Py_XDECREF(text);
    Py_XDECREF(msg);
    if (err == NULL) {
        Py_DECREF(exc);
        return;
    }
    if (!PyExceptionInstance_Check(err)) {
        PyErr_Format(PyExc_TypeError, "invalid_event_error() returned %.200s, not an exception",
                     Py_TYPE(err)->tp_name);
        Py_DECREF(err);
        Py_DECREF(exc);
        return;
    }
    PyException_SetCause(err, Py_NewRef(exc)); /* steals; sets __suppress_context__ */
    PyException_SetContext(err, exc);          /* steals */
    PyErr_SetRaisedException(err);             /* steals; no implicit chaining */
}

/* --------------------------------------------------------------- encode_body */

/* UTF-8 of one text field: a plain str directly, anything else via its
 * .encode() like the reference (the bytes are kept alive in *owned). */
static int
field_utf8(PyObject *obj, PyObject **owned, const char **p, Py_ssize_t *n)
{
    if (PyUnicode_CheckExact(obj)) {
        *p = PyUnicode_AsUTF8AndSize(obj, n);
        return *p == NULL ? -1 : 0;
    }
    PyObject *enc = PyObject_CallMethod(obj, "encode", NULL);
    if (enc == NULL) {
        return -1;
    }
    if (!PyBytes_Check(enc)) {
        PyErr_Format(PyExc_TypeError, "%.200s.encode() returned %.200s, not bytes",
                     Py_TYPE(obj)->tp_name, Py_TYPE(enc)->tp_name);
        Py_DECREF(enc);
        return -1;
    }
    *owned = enc;
    *p = PyBytes_AS_STRING(enc);
    *n = PyBytes_GET_SIZE(enc);
    return 0;
}

static void
put_le(unsigned char *p, uint64_t v, int size)
{
    for (int i = 0; i < size; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* BODY_HEADER.pack(ts_ms, lr, lt, lp) into out; anything but a plain int64
 * ts_ms and u16 lengths goes through struct.pack itself. */
static int
pack_body_header(walcodec_state *st, unsigned char *out, PyObject *ts, const Py_ssize_t *lens)
{
    int overflow = 1;
    long long ts_ms = 0;
    if (PyLong_CheckExact(ts)) {
        ts_ms = PyLong_AsLongLongAndOverflow(ts, &overflow);
    }
    if (!overflow && lens[0] <= 0xFFFF && lens[1] <= 0xFFFF && lens[2] <= 0xFFFF) {
        put_le(out, (uint64_t)ts_ms, 8);
        for (int i = 0; i < 3; i++) {
            put_le(out + 8 + 2 * i, (uint64_t)lens[i], 2);
        }
        return 0;
    }
    PyObject *packed =
        PyObject_CallFunction(st->struct_pack, "sOnnn", "<qHHH", ts, lens[0], lens[1], lens[2]);
    if (packed == NULL) {
        return -1;
    }
    if (!PyBytes_Check(packed) || PyBytes_GET_SIZE(packed) != BODY_HEADER_SIZE) {
        PyErr_SetString(PyExc_SystemError, "struct.pack('<qHHH') returned an odd result");
        Py_DECREF(packed);
        return -1;
    }
    memcpy(out, PyBytes_AS_STRING(packed), BODY_HEADER_SIZE);
    Py_DECREF(packed);
    return 0;
}

/* FRAME_OVERHEAD + size > limit, with the reference's semantics for any limit. */
static int
exceeds(Py_ssize_t frame_size, PyObject *limit)
{
    if (PyLong_CheckExact(limit)) {
        int overflow;
        long long max = PyLong_AsLongLongAndOverflow(limit, &overflow);
        return overflow ? overflow < 0 : (long long)frame_size > max;
    }
    PyObject *size = PyLong_FromSsize_t(frame_size);
    if (size == NULL) {
        return -1;
    }
    int rc = PyObject_RichCompareBool(size, limit, Py_GT);
    Py_DECREF(size);
    return rc;
}

static void
raise_too_large(walcodec_state *st, PyObject *etype, Py_ssize_t frame_size, PyObject *limit)
{
    PyObject *cls = Py_NewRef(st->too_large_error); /* Python code runs below */
    PyObject *limit_text = PyObject_Format(limit, NULL);
    PyObject *msg = limit_text ? PyUnicode_FromFormat(
                                     "event of type %R encodes to %zd bytes; the limit is %U",
                                     etype, frame_size, limit_text)
                               : NULL;
    if (msg != NULL) {
        PyErr_SetObject(cls, msg);
    }
    Py_XDECREF(msg);
    Py_XDECREF(limit_text);
    Py_DECREF(cls);
}

PyDoc_STRVAR(encode_body_doc,
             "encode_body(event, max_record_bytes, /)\n--\n\n"
             "Same bytes and errors as registry.record.encode_body(event, max_record_bytes).");

static PyObject *
walcodec_encode_body(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    walcodec_state *st = configured_state(module);
    if (st == NULL) {
        return NULL;
    }
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "encode_body() takes exactly 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *event = args[0], *limit = args[1];
    if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) != 5) {
        PyErr_Format(PyExc_TypeError, "encode_body() expects a NewEvent, not %.200s",
                     Py_TYPE(event)->tp_name);
        return NULL;
    }
    PyObject *owned[3] = {NULL, NULL, NULL}, *json_str = NULL, *result = NULL;
    const char *text[4];
    Py_ssize_t lens[4];
    Buf json;
    buf_init(&json);

    for (int i = 0; i < 3; i++) { /* run_id, type, principal */
        if (field_utf8(PyTuple_GET_ITEM(event, i), &owned[i], &text[i], &lens[i]) < 0) {
            goto done;
        }
    }
    PyObject *data = PyTuple_GET_ITEM(event, 3);
    int fast = json_fast(&json, data);
    if (fast < 0) {
        goto done;
    }
    if (fast) {
        text[3] = json.data;
        lens[3] = json.len;
    }
    else {
        PyObject *fallback = Py_NewRef(st->json_fallback); /* configure() may run meanwhile */
        json_str = PyObject_CallOneArg(fallback, data);
        Py_DECREF(fallback);
        if (json_str != NULL && !PyUnicode_Check(json_str)) {
            PyErr_Format(PyExc_TypeError, "json_fallback() returned %.200s, not str",
                         Py_TYPE(json_str)->tp_name);
            goto done;
        }
        if (json_str == NULL || (text[3] = PyUnicode_AsUTF8AndSize(json_str, &lens[3])) == NULL) {
            raise_invalid_data(st);
            goto done;
        }
    }
    unsigned char header[BODY_HEADER_SIZE];
    if (pack_body_header(st, header, PyTuple_GET_ITEM(event, 4), lens) < 0) {
        goto done;
    }
    Py_ssize_t size = BODY_HEADER_SIZE; /* each part is a live object: no overflow */
    for (int i = 0; i < 4; i++) {
        size += lens[i];
    }
    int too_large = exceeds(FRAME_OVERHEAD + size, limit);
    if (too_large) {
        if (too_large > 0) {
            raise_too_large(st, PyTuple_GET_ITEM(event, 1), FRAME_OVERHEAD + size, limit);
        }
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result != NULL) {
        char *out = PyBytes_AS_STRING(result);
        memcpy(out, header, BODY_HEADER_SIZE);
        out += BODY_HEADER_SIZE;
        for (int i = 0; i < 4; i++) {
            memcpy(out, text[i], (size_t)lens[i]);
            out += lens[i];
        }
    }
done:
    buf_free(&json);
    Py_XDECREF(json_str);
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(owned[i]);
    }
    return result;
}

/* ------------------------------------------------------------- encode_frames */

static const char *
body_bytes(PyObject *body, Py_ssize_t *n)
{
    if (PyBytes_Check(body)) {
        *n = PyBytes_GET_SIZE(body);
        return PyBytes_AS_STRING(body);
    }
    if (PyByteArray_Check(body)) {
        *n = PyByteArray_GET_SIZE(body);
        return PyByteArray_AS_STRING(body);
    }
    /* The reference's errors: len(body), then crc32c.crc32c(body). */
    if (PyObject_CheckBuffer(body)) {
        PyErr_Format(PyExc_TypeError, "encode_frames() takes bytes or bytearray, not '%.200s'",
                     Py_TYPE(body)->tp_name);
    }
    else if (PyObject_Size(body) >= 0) {
        PyErr_Format(PyExc_TypeError, "a bytes-like object is required, not '%.200s'",
                     Py_TYPE(body)->tp_name);
    }
    return NULL;
}

/* Raise what SEQ.pack(first_seq + offset) raises. */
static void
raise_seq_error(walcodec_state *st, PyObject *first, Py_ssize_t offset)
{
    PyObject *delta = PyLong_FromSsize_t(offset);
    PyObject *seq = delta == NULL ? NULL : offset ? PyNumber_Add(first, delta) : Py_NewRef(first);
    PyObject *packed = seq ? PyObject_CallFunction(st->struct_pack, "sO", "<Q", seq) : NULL;
    if (packed != NULL) {
        PyErr_SetString(PyExc_SystemError, "struct.pack('<Q') accepted an out-of-range seq");
    }
    Py_XDECREF(packed);
    Py_XDECREF(seq);
    Py_XDECREF(delta);
}

PyDoc_STRVAR(encode_frames_doc,
             "encode_frames(first_seq, bodies, /)\n--\n\n"
             "Same bytes and errors as registry.record.encode_frames(first_seq, bodies).");

static PyObject *
walcodec_encode_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    walcodec_state *st = configured_state(module);
    if (st == NULL) {
        return NULL;
    }
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "encode_frames() takes exactly 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *seq_obj = args[0];
    PyObject *items = PySequence_Fast(args[1], "encode_frames() bodies must be iterable");
    if (items == NULL) {
        return NULL;
    }
    PyObject *first = NULL, *result = NULL;
    if (PySequence_Fast_GET_SIZE(items) == 0) {
        result = PyBytes_FromStringAndSize(NULL, 0);
        goto done;
    }
    /* The first seq as an int in [0, 2**64): else SEQ.pack's own error. */
    first = PyLong_Check(seq_obj) || PyIndex_Check(seq_obj) ? PyNumber_Index(seq_obj) : NULL;
    if (first == NULL && PyErr_Occurred()) {
        goto done;
    }
    /* Read only now: __index__ may have changed the list. */
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    PyObject **bodies = PySequence_Fast_ITEMS(items);
    if (count == 0) {
        result = PyBytes_FromStringAndSize(NULL, 0);
        goto done;
    }
    unsigned long long seq0 = first ? PyLong_AsUnsignedLongLong(first) : (unsigned long long)-1;
    if (first == NULL || (seq0 == (unsigned long long)-1 && PyErr_Occurred())) {
        PyErr_Clear();
        raise_seq_error(st, first ? first : seq_obj, 0);
        goto done;
    }
    /* Index of the first body whose seq would pass 2**64 - 1 (count if none). */
    Py_ssize_t seq_end = UINT64_MAX - seq0 < (unsigned long long)count - 1
                             ? (Py_ssize_t)(UINT64_MAX - seq0) + 1
                             : count;

    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t n;
        if (i == seq_end) {
            raise_seq_error(st, first, i);
            goto done;
        }
        if (body_bytes(bodies[i], &n) == NULL) {
            goto done;
        }
        if ((size_t)n > (size_t)UINT32_MAX - SEQ_SIZE) { /* FRAME_HEADER.pack would fail */
            PyObject *r = PyObject_CallFunction(st->struct_pack, "snI", "<II", n + SEQ_SIZE, 0u);
            Py_XDECREF(r);
            if (r != NULL) {
                PyErr_SetString(PyExc_SystemError, "struct.pack('<I') accepted an oversize frame");
            }
            goto done;
        }
        if (n > PY_SSIZE_T_MAX - FRAME_OVERHEAD - total) {
            PyErr_NoMemory();
            goto done;
        }
        total += FRAME_OVERHEAD + n;
    }

    /* No Python code runs from here on: the bodies cannot change. */
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        goto done;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t n;
        const char *body = body_bytes(bodies[i], &n);
        unsigned char *seq_bytes = out + FRAME_HEADER_SIZE;
        put_le(seq_bytes, seq0 + (unsigned long long)i, SEQ_SIZE);
        uint32_t crc = crc_update(0xFFFFFFFFu, seq_bytes, SEQ_SIZE);
        crc = ~crc_update(crc, (const unsigned char *)body, (size_t)n);
        put_le(out, (uint64_t)n + SEQ_SIZE, 4);
        put_le(out + 4, crc, 4);
        memcpy(out + FRAME_OVERHEAD, body, (size_t)n);
        out += FRAME_OVERHEAD + n;
    }
done:
    Py_XDECREF(first);
    Py_DECREF(items);
    return result;
}

/* ----------------------------------------------------------------- configure */

/* Compare native CRC32C (both implementations) with the reference callable. */
static int
check_crc(PyObject *crc32c)
{
    unsigned char data[300];
    for (size_t i = 0; i < sizeof(data); i++) {
        data[i] = (unsigned char)(i * 131u + 7u);
    }
    static const uint32_t seeds[] = {0u, 0xE3069283u, 0xFFFFFFFFu};
    for (size_t len = 0; len <= sizeof(data); len += len < 40 ? 1 : 37) {
        for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
            size_t skip = len % 8; /* unaligned starts too */
            size_t n = len - skip;
            PyObject *ref = PyObject_CallFunction(crc32c, "y#k", data + skip, (Py_ssize_t)n,
                                                  (unsigned long)seeds[s]);
            if (ref == NULL) {
                return -1;
            }
            unsigned long want = PyLong_AsUnsignedLong(ref);
            Py_DECREF(ref);
            if (want == (unsigned long)-1 && PyErr_Occurred()) {
                return -1;
            }
            uint32_t table = ~crc_update_table(~seeds[s], data + skip, n);
            uint32_t native = ~crc_update(~seeds[s], data + skip, n);
            if (table != want || native != want) {
                PyErr_Format(PyExc_RuntimeError,
                             "native CRC32C disagrees with the crc32c callable "
                             "(%zu bytes: %lx/%lx, expected %lx)",
                             n, (unsigned long)table, (unsigned long)native, want);
                return -1;
            }
        }
    }
    return 0;
}

static int
check_exception_class(PyObject *cls, const char *name)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls,
                                                (PyTypeObject *)PyExc_Exception)) {
        PyErr_Format(PyExc_TypeError, "configure(): %s must be an Exception subclass", name);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(configure_doc,
             "configure(invalid_event_error, too_large_error, json_fallback, crc32c, /)\n--\n\n"
             "Set what encode_body raises and how it encodes data off the fast path.\n"
             "crc32c (crc32c.crc32c) is the reference the native CRC32C is checked against.");

static PyObject *
walcodec_configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "configure() takes exactly 4 arguments (%zd given)", nargs);
        return NULL;
    }
    if (check_exception_class(args[0], "invalid_event_error") < 0 ||
        check_exception_class(args[1], "too_large_error") < 0) {
        return NULL;
    }
    if (!PyCallable_Check(args[2]) || !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "configure(): json_fallback and crc32c must be callable");
        return NULL;
    }
    if (check_crc(args[3]) < 0) {
        return NULL;
    }
    walcodec_state *st = get_state(module);
    Py_XSETREF(st->invalid_event_error, Py_NewRef(args[0]));
    Py_XSETREF(st->too_large_error, Py_NewRef(args[1]));
    Py_XSETREF(st->crc32c, Py_NewRef(args[3]));
    Py_XSETREF(st->json_fallback, Py_NewRef(args[2])); /* last: marks configured */
    Py_RETURN_NONE;
}

/* Test hook: CRC32C of data continuing from value, like crc32c.crc32c. */
static PyObject *
walcodec_crc32c(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer view;
    unsigned int value = 0;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "y*|Ip:_crc32c", &view, &value, &portable)) {
        return NULL;
    }
    crc_update_fn update = portable ? crc_update_table : crc_update;
    uint32_t crc = ~update(~(uint32_t)value, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* -------------------------------------------------------------------- module */

static PyMethodDef walcodec_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))walcodec_configure, METH_FASTCALL, configure_doc},
    {"encode_body", (PyCFunction)(void (*)(void))walcodec_encode_body, METH_FASTCALL,
     encode_body_doc},
    {"encode_frames", (PyCFunction)(void (*)(void))walcodec_encode_frames, METH_FASTCALL,
     encode_frames_doc},
    {"_crc32c", walcodec_crc32c, METH_VARARGS,
     "_crc32c(data, value=0, portable=False, /)\n--\n\n"
     "CRC32C for tests; portable=True forces the table implementation."},
    {NULL, NULL, 0, NULL},
};

static int
walcodec_exec(PyObject *module)
{
    static int crc_ready = 0;
    if (!crc_ready) {
        crc_table_init();
#ifdef HAVE_CRC_SSE42
        __builtin_cpu_init();
        if (__builtin_cpu_supports("sse4.2")) {
            crc_update = crc_update_sse42;
        }
#endif
        crc_ready = 1;
    }
    walcodec_state *st = get_state(module);
    PyObject *struct_mod = PyImport_ImportModule("struct");
    if (struct_mod == NULL) {
        return -1;
    }
    st->struct_pack = PyObject_GetAttrString(struct_mod, "pack");
    Py_DECREF(struct_mod);
    if (st->struct_pack == NULL) {
        return -1;
    }
    return PyModule_AddStringConstant(module, "CRC32C_IMPL",
                                      crc_update == crc_update_table ? "table" : "sse4.2");
}

static int
walcodec_traverse(PyObject *module, visitproc visit, void *arg)
{
    walcodec_state *st = get_state(module);
    Py_VISIT(st->invalid_event_error);
    Py_VISIT(st->too_large_error);
    Py_VISIT(st->json_fallback);
    Py_VISIT(st->crc32c);
    Py_VISIT(st->struct_pack);
    return 0;
}

static int
walcodec_clear(PyObject *module)
{
    walcodec_state *st = get_state(module);
    Py_CLEAR(st->invalid_event_error);
    Py_CLEAR(st->too_large_error);
    Py_CLEAR(st->json_fallback);
    Py_CLEAR(st->crc32c);
    Py_CLEAR(st->struct_pack);
    return 0;
}

static void
walcodec_free(void *module)
{
    (void)walcodec_clear((PyObject *)module);
}

static PyModuleDef_Slot walcodec_slots[] = {
    {Py_mod_exec, walcodec_exec},
    {0, NULL},
};

PyDoc_STRVAR(walcodec_doc,
             "The WAL record codec's hot path in C: encode_body and encode_frames.\n\n"
             "Byte-identical to registry.record, which is the reference implementation\n"
             "(and the fallback where this extension is not built). Call configure()\n"
             "once before use; registry.record does so at import.");

static struct PyModuleDef walcodec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "registry._walcodec",
    .m_doc = walcodec_doc,
    .m_size = sizeof(walcodec_state),
    .m_methods = walcodec_methods,
    .m_slots = walcodec_slots,
    .m_traverse = walcodec_traverse,
    .m_clear = walcodec_clear,
    .m_free = walcodec_free,
};

PyMODINIT_FUNC
PyInit__walcodec(void)
{
    return PyModuleDef_Init(&walcodec_module);
}
