/* pipeline._luma: the small luma picture of the scene and black analyzers.
 *
 * block_means(plane, width, height, line_size, out_width, out_height,
 *             limited_range) reads an 8-bit luma plane (rows of line_size
 * bytes, the first width of them pixels) and returns out_height rows of
 * out_width bytes, as one bytes object: each the mean of one block of the picture, the
 * blocks tiling it exactly (column i covers x in [i*width/out_width,
 * (i+1)*width/out_width), rows alike), rounded to the nearest code. With
 * limited_range the mean is mapped from video range (16..235) to full range
 * (0..255, clamped), as swscale maps limited-range luma to "gray".
 *
 * Rules: every size and the plane's buffer are checked before anything is read
 * (ValueError); the picture must be at least as large as the output in both
 * directions (the caller upscales some other way). The sums run with the GIL
 * released: the plane stays pinned by its buffer view until the call returns,
 * and the result is a bytes object no other code can see before it is
 * returned (so it is filled without the GIL, and immutable after: the
 * analyzers share it). Returning it, rather than filling a caller's numpy
 * array, spares the worker a numpy allocation and a flags call per frame,
 * which on a thread whose caches the decoder just went through cost about
 * 10 us of a 1.2 ms 720p decode (docs/PERFORMANCE.md, "Analyzers"). Its
 * scratch (the tile bounds and one row of column sums) is allocated per call
 * (raw allocator, no GIL needed) and freed before it returns.
 *
 * code_sum(codes) and abs_diff_sum(a, b) are the two sums the black and scene
 * analyzers take of those 2304 codes: one C loop each instead of numpy's three
 * calls and a temporary (the GIL is kept; 2304 bytes take well under a
 * microsecond). Exact integers, so the analyzers' figures are the ones numpy
 * gave. Their buffers must be C-contiguous (BufferError otherwise): small_luma
 * returns bytes.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIDE 65536 /* column sums of up to MAX_SIDE rows of 255 fit 32 bits */
#define PREFETCH_ROWS 8 /* how far ahead rows are fetched (see prefetch_row) */
#define NARROW_ROWS 257 /* 16-bit column sums of up to this many rows of 255 fit */

/* Ask for row y + PREFETCH_ROWS while row y is summed. The plane is read once, right
 * after the decoder wrote it and mostly from memory; the hardware prefetchers stop at
 * each 4 KiB page, and a 1280-pixel row is a third of one. Fetching 8 rows (about
 * 10 KB) ahead took a cold 720p plane from about 150 to 120 us in a C loop on the
 * development host (docs/PERFORMANCE.md, "Analyzers"). A hint only: nothing is read past the
 * plane, and compilers without the builtin skip it. */
static inline void
prefetch_row(const uint8_t *plane, Py_ssize_t y, Py_ssize_t width, Py_ssize_t height,
             Py_ssize_t line_size)
{
#if defined(__GNUC__) || defined(__clang__)
    if (y + PREFETCH_ROWS < height) {
        const uint8_t *ahead = plane + (y + PREFETCH_ROWS) * line_size;
        for (Py_ssize_t x = 0; x < width; x += 64) {
            __builtin_prefetch(ahead + x);
        }
    }
#else
    (void)plane, (void)y, (void)width, (void)height, (void)line_size;
#endif
}

/* Column sums of rows [y0, y1): into narrow[0..width), 16 bits, while they cannot
 * overflow (up to NARROW_ROWS rows of 255), which halves the vector work, else into
 * columns[0..width), 32 bits.
 *
 * Built twice by GCC's target_clones (the loader picks one per CPU through an ifunc):
 * with AVX2 the compiler vectorizes the sums 32 bytes at a time instead of 16, which
 * took a 720p plane's block means from about 95 to 50 us in a C loop
 * (docs/PERFORMANCE.md, "Analyzers"). One source, so both clones compute the same exact
 * integers; other compilers and targets build the portable loop only. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SUM_ROWS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SUM_ROWS_CLONES
#endif

SUM_ROWS_CLONES static void
sum_rows(const uint8_t *restrict plane, Py_ssize_t width, Py_ssize_t height,
         Py_ssize_t line_size, Py_ssize_t y0, Py_ssize_t y1, uint32_t *restrict columns,
         uint16_t *restrict narrow)
{
    if (y1 - y0 <= NARROW_ROWS) {
        memset(narrow, 0, (size_t)width * sizeof(uint16_t));
        for (Py_ssize_t y = y0; y < y1; y++) {
            prefetch_row(plane, y, width, height, line_size);
            const uint8_t *restrict row = plane + y * line_size;
            for (Py_ssize_t x = 0; x < width; x++) {
                narrow[x] = (uint16_t)(narrow[x] + row[x]);
            }
        }
        return;
    }
    memset(columns, 0, (size_t)width * sizeof(uint32_t));
    for (Py_ssize_t y = y0; y < y1; y++) {
        prefetch_row(plane, y, width, height, line_size);
        const uint8_t *restrict row = plane + y * line_size;
        for (Py_ssize_t x = 0; x < width; x++) {
            columns[x] += row[x];
        }
    }
}

/* round(n / den) for 0 <= n < 2^52, 0 < den < 2^40, given inv = 1.0 / den: the
 * double quotient and one correction step, exact. A 64-bit integer division per
 * output code cost more than the whole 64x36 output's sums on a small picture (about
 * 24 us for 2304 of them); the reciprocal is computed once per distinct tile size. */
static inline int64_t
rounded_quotient(int64_t n, int64_t den, double inv)
{
    int64_t half = n + den / 2;
    int64_t q = (int64_t)((double)half * inv);
    if (q * den > half) {
        q--;
    }
    else if ((q + 1) * den <= half) {
        q++;
    }
    return q;
}

/* The 16-bit column sums of rows [y0, y1) (at most NARROW_ROWS of them) into narrow, by
 * strips of 32 columns that stay in two AVX2 registers over the rows: where sum_rows
 * loads and stores its 16-bit sums once per row, this does once per tile row. The
 * strips walk down the rows, which the hardware prefetchers follow less well than a
 * row, so each row's line is fetched one tile row ahead (bounded to the plane). A
 * 720p plane in a C loop on the development host: 107-132 -> 80-92 us from memory,
 * 25 -> 21 us from cache (docs/PERFORMANCE.md, "Analyzers"). The columns past the
 * last whole strip are summed one by one. Same integers as sum_rows: both add bytes
 * into 16 bits that cannot overflow. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_STRIPS 1
__attribute__((target("avx2"))) static void
sum_strips_avx2(const uint8_t *restrict plane, Py_ssize_t width, Py_ssize_t height,
                Py_ssize_t line_size, Py_ssize_t y0, Py_ssize_t y1,
                uint16_t *restrict narrow)
{
    Py_ssize_t rows = y1 - y0;
    Py_ssize_t ahead_rows = y1 + rows <= height ? rows : 0; /* inside the plane only */
    Py_ssize_t x = 0;
    for (; x + 32 <= width; x += 32) {
        __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
        const uint8_t *at = plane + y0 * line_size + x;
        int fetch = ahead_rows > 0 && (x & 63) == 0; /* once per 64-byte line */
        for (Py_ssize_t y = y0; y < y1; y++, at += line_size) {
            if (fetch) {
                _mm_prefetch((const char *)(at + ahead_rows * line_size), _MM_HINT_T0);
            }
            low = _mm256_add_epi16(low, _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)at)));
            high = _mm256_add_epi16(
                high, _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(at + 16))));
        }
        _mm256_storeu_si256((__m256i *)(narrow + x), low);
        _mm256_storeu_si256((__m256i *)(narrow + x + 16), high);
    }
    for (; x < width; x++) {
        uint16_t sum = 0;
        for (Py_ssize_t y = y0; y < y1; y++) {
            sum = (uint16_t)(sum + plane[y * line_size + x]);
        }
        narrow[x] = sum;
    }
}
#endif

static int use_strips; /* set once at module load: the CPU has AVX2 */

static void
compute(const uint8_t *restrict plane, Py_ssize_t width, Py_ssize_t height,
        Py_ssize_t line_size, uint8_t *restrict out, Py_ssize_t out_width,
        Py_ssize_t out_height, int limited, uint32_t *restrict columns,
        uint16_t *restrict narrow, Py_ssize_t *restrict xs)
{
    for (Py_ssize_t i = 0; i <= out_width; i++) {
        xs[i] = i * width / out_width;
    }
    int64_t last_den = 0;
    double inv = 0.0;
    for (Py_ssize_t j = 0; j < out_height; j++) {
        Py_ssize_t y0 = j * height / out_height, y1 = (j + 1) * height / out_height;
        int in_narrow = y1 - y0 <= NARROW_ROWS; /* where either loop leaves the sums */
#ifdef HAVE_STRIPS
        if (in_narrow && use_strips) {
            sum_strips_avx2(plane, width, height, line_size, y0, y1, narrow);
        }
        else
#endif
        {
            sum_rows(plane, width, height, line_size, y0, y1, columns, narrow);
        }
        for (Py_ssize_t i = 0; i < out_width; i++) {
            uint64_t sum = 0;
            for (Py_ssize_t x = xs[i]; x < xs[i + 1]; x++) {
                sum += in_narrow ? narrow[x] : columns[x];
            }
            int64_t count = (int64_t)(xs[i + 1] - xs[i]) * (y1 - y0);
            /* limited: round(255 * (mean - 16) / 219), clamped to 0..255 */
            int64_t num = limited ? 255 * ((int64_t)sum - 16 * count) : (int64_t)sum;
            int64_t den = limited ? 219 * count : count;
            if (den != last_den) {
                last_den = den;
                inv = 1.0 / (double)den;
            }
            int64_t code = num <= 0 ? 0 : rounded_quotient(num, den, inv);
            out[j * out_width + i] = (uint8_t)(code > 255 ? 255 : code);
        }
    }
}

PyDoc_STRVAR(block_means_doc,
"block_means(plane, width, height, line_size, out_width, out_height,\n"
"            limited_range, /)\n"
"--\n\n"
"The out_width x out_height block means of an 8-bit luma plane, row by row, as\n"
"bytes (module doc). Raises ValueError for sizes or a plane that do not fit.");

static PyObject *
block_means(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer plane;
    Py_ssize_t width, height, line_size, out_width, out_height;
    int limited;
    if (!PyArg_ParseTuple(args, "y*nnnnnp:block_means", &plane, &width, &height,
                          &line_size, &out_width, &out_height, &limited)) {
        return NULL;
    }
    const char *problem = NULL;
    if (out_width < 1 || out_height < 1 || width < out_width || height < out_height) {
        problem = "the picture must be at least as large as the output, which is not empty";
    }
    else if (width > MAX_SIDE || height > MAX_SIDE) {
        problem = "the picture is larger than 65536 pixels on a side";
    }
    else if (line_size < width || line_size > 4 * MAX_SIDE) {
        problem = "line_size is shorter than the picture's width, or over 262144";
    }
    else if (plane.len < (height - 1) * line_size + width) {
        problem = "the plane is shorter than height rows of line_size bytes";
    }
    if (problem != NULL) {
        PyBuffer_Release(&plane);
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    /* out_width <= width <= MAX_SIDE and out_height likewise: the product fits */
    PyObject *out = PyBytes_FromStringAndSize(NULL, out_width * out_height);
    /* one block: the tile bounds, the 32-bit column sums, then the 16-bit ones */
    size_t bounds = (size_t)(out_width + 1) * sizeof(Py_ssize_t);
    char *scratch = out == NULL ? NULL : PyMem_RawMalloc(
        bounds + (size_t)width * (sizeof(uint32_t) + sizeof(uint16_t)));
    if (scratch == NULL) {
        PyBuffer_Release(&plane);
        if (out == NULL) {
            return NULL;
        }
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    uint32_t *columns = (uint32_t *)(scratch + bounds);
    uint8_t *codes = (uint8_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    compute((const uint8_t *)plane.buf, width, height, line_size, codes, out_width,
            out_height, limited, columns, (uint16_t *)(columns + width),
            (Py_ssize_t *)scratch);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(scratch);
    PyBuffer_Release(&plane);
    return out;
}

PyDoc_STRVAR(code_sum_doc,
"code_sum(codes, /)\n"
"--\n\n"
"The sum of the bytes of codes (any bytes-like object).");

static PyObject *
code_sum(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer codes;
    if (PyObject_GetBuffer(arg, &codes, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const uint8_t *bytes = (const uint8_t *)codes.buf;
    unsigned long long sum = 0;
    for (Py_ssize_t i = 0; i < codes.len; i++) {
        sum += bytes[i];
    }
    PyBuffer_Release(&codes);
    return PyLong_FromUnsignedLongLong(sum);
}

PyDoc_STRVAR(abs_diff_sum_doc,
"abs_diff_sum(a, b, /)\n"
"--\n\n"
"The sum of |a[i] - b[i]| over the bytes of two bytes-like objects of one length\n"
"(ValueError when the lengths differ).");

static PyObject *
abs_diff_sum(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "abs_diff_sum takes exactly two arguments");
        return NULL;
    }
    Py_buffer a, b;
    if (PyObject_GetBuffer(args[0], &a, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &b, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    unsigned long long sum = 0;
    int same = a.len == b.len;
    if (same) {
        const uint8_t *pa = (const uint8_t *)a.buf, *pb = (const uint8_t *)b.buf;
        for (Py_ssize_t i = 0; i < a.len; i++) {
            sum += pa[i] > pb[i] ? (unsigned)(pa[i] - pb[i]) : (unsigned)(pb[i] - pa[i]);
        }
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    if (!same) {
        PyErr_SetString(PyExc_ValueError, "abs_diff_sum needs two buffers of one length");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(sum);
}

static PyMethodDef luma_methods[] = {
    {"block_means", block_means, METH_VARARGS, block_means_doc},
    {"code_sum", code_sum, METH_O, code_sum_doc},
    {"abs_diff_sum", (PyCFunction)(void (*)(void))abs_diff_sum, METH_FASTCALL, abs_diff_sum_doc},
    {NULL, NULL, 0, NULL},
};

/* strips: whether block_means takes the AVX2 strips (the CPU has AVX2 and
 * WHIP_LUMA_PORTABLE was not set when the module was loaded) or the portable loop. */
static int
luma_exec(PyObject *module)
{
    return PyModule_AddIntConstant(module, "strips", use_strips);
}

static PyModuleDef_Slot luma_slots[] = {
    {Py_mod_exec, luma_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef luma_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pipeline._luma",
    .m_doc = "The block means behind pipeline.analyzers.base.small_luma.",
    .m_size = 0,
    .m_methods = luma_methods,
    .m_slots = luma_slots,
};

PyMODINIT_FUNC
PyInit__luma(void)
{
#ifdef HAVE_STRIPS
    use_strips = __builtin_cpu_supports("avx2") && getenv("WHIP_LUMA_PORTABLE") == NULL;
#endif
    return PyModuleDef_Init(&luma_module);
}
