/* _ternmodule.c — tern._tern, the CPython extension behind the `tern` package: tern_eager.h's
 * reference-counted tensors as a Python type, every registry operator as tern.op.NAME, autograd and
 * the optimizers. numpy is reached only through the buffer protocol (and imported at call time for
 * numpy(), repr and lists), so the module builds without numpy's headers.
 *
 * The module holds one default context. Every call keeps the GIL: a context is not safe to use from
 * two threads at once, and the GIL is what serialises them. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tern_config.h"
#include "stack_key.h"
#include "tern_eager.h"

static tern_ctx *g_ctx;
static PyObject *g_error, *g_usage_error, *g_data_error;

static PyTypeObject TensorType, ParameterType, OptimizerType, OpNamespaceType, OperatorType;

/* (The object heads are kept from clang-format: PyObject_HEAD and PyVarObject_HEAD_INIT end
 * without the semicolon or comma it expects.) */
#define Tensor_Check(o) PyObject_TypeCheck((o), &TensorType)
/* tern/_tensor.py's hooks (mod_set_hooks): assignment to an index, indexing by a boolean mask, and
 * finishing an in-place operator (+= ...) from its result. */
static PyObject *g_setitem_hook, *g_mask_hook, *g_inplace_hook;
#define VAR(o) (((TensorObject *)(o))->var)

/* clang-format off */
typedef struct {
	PyObject_HEAD
	tern_var *var; /* owned; replaced by an in-place operation that has a history (_assign_), while
	                * a buffer export holds the bytes it was made from */
	PyObject *weakrefs;
} TensorObject;
/* clang-format on */

/* ---------------------------------------------------------------- errors */

/* Raises the exception for a failed tern call, with tern_error()'s one-line message. Returns NULL. */
static PyObject *raise_status(tern_status rc)
{
	const char *msg = tern_error();
	if (!msg || !*msg)
		msg = "tern call failed";
	PyObject *type = g_error;
	switch (rc) {
	case TERN_EUSAGE: type = g_usage_error; break;
	case TERN_EDATA: type = g_data_error; break;
	case TERN_EOS: type = PyExc_MemoryError; break;
	default: break;
	}
	PyErr_SetString(type, msg);
	return NULL;
}

/* The same, for functions returning int. */
static int fail_status(tern_status rc)
{
	raise_status(rc);
	return -1;
}

/* ---------------------------------------------------------------- element types */

static const struct dtype_info {
	int dtype;
	const char *name; /* numpy's name, what Tensor.dtype says */
	const char *format; /* the struct-module code of the buffer protocol; NULL: numpy has no such type */
} dtypes[] = {
        {TERN_FLOAT, "float32", "f"},
        {TERN_DOUBLE, "float64", "d"},
        {TERN_FLOAT16, "float16", "e"},
        {TERN_BFLOAT16, "bfloat16", NULL},
        {TERN_INT8, "int8", "b"},
        {TERN_INT16, "int16", "h"},
        {TERN_INT32, "int32", "i"},
        {TERN_INT64, "int64", "q"},
        {TERN_UINT8, "uint8", "B"},
        {TERN_UINT16, "uint16", "H"},
        {TERN_UINT32, "uint32", "I"},
        {TERN_UINT64, "uint64", "Q"},
        {TERN_BOOL, "bool", "?"},
        {TERN_COMPLEX64, "complex64", "Zf"},
        {TERN_COMPLEX128, "complex128", "Zd"},
        {TERN_STRING, "string", NULL},
        {TERN_FLOAT8E4M3FN, "float8e4m3fn", NULL},
        {TERN_FLOAT8E4M3FNUZ, "float8e4m3fnuz", NULL},
        {TERN_FLOAT8E5M2, "float8e5m2", NULL},
        {TERN_FLOAT8E5M2FNUZ, "float8e5m2fnuz", NULL},
};

/* Other spellings tern.tensor(dtype=...) accepts: torch's and ONNX's. */
static const struct {
	const char *alias;
	int dtype;
} dtype_aliases[] = {
        {"float", TERN_FLOAT}, {"double", TERN_DOUBLE}, {"half", TERN_FLOAT16},     {"long", TERN_INT64},
        {"short", TERN_INT16}, {"bool_", TERN_BOOL},    {"cfloat", TERN_COMPLEX64}, {"cdouble", TERN_COMPLEX128},
};

static const struct dtype_info *dtype_info(int dtype)
{
	for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
		if (dtypes[i].dtype == dtype)
			return &dtypes[i];
	return NULL;
}

static const char *dtype_str(int dtype)
{
	const struct dtype_info *d = dtype_info(dtype);
	return d ? d->name : tern_dtype_name(dtype);
}

static int is_float(int d)
{
	return d == TERN_FLOAT || d == TERN_DOUBLE || d == TERN_FLOAT16 || d == TERN_BFLOAT16 ||
	        (d >= TERN_FLOAT8E4M3FN && d <= TERN_FLOAT8E5M2FNUZ);
}

static int is_complex(int d)
{
	return d == TERN_COMPLEX64 || d == TERN_COMPLEX128;
}

static int is_int(int d)
{
	return d == TERN_INT8 || d == TERN_INT16 || d == TERN_INT32 || d == TERN_INT64 || d == TERN_UINT8 ||
	        d == TERN_UINT16 || d == TERN_UINT32 || d == TERN_UINT64;
}

static int dtype_from_str(const char *s)
{
	if (!strncmp(s, "torch.", 6))
		s += 6;
	else if (!strncmp(s, "numpy.", 6))
		s += 6;
	for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
		if (!strcmp(dtypes[i].name, s))
			return dtypes[i].dtype;
	for (size_t i = 0; i < sizeof dtype_aliases / sizeof *dtype_aliases; i++)
		if (!strcmp(dtype_aliases[i].alias, s))
			return dtype_aliases[i].dtype;
	return tern_dtype_from_name(s);
}

/* A dtype argument: None (leaves *out as it is), a name ('float32', 'int64', torch's and ONNX's
 * spellings), a numpy dtype or scalar type, Python's float, int or bool, or an ONNX type number. */
static int parse_dtype(PyObject *o, int *out)
{
	if (!o || o == Py_None)
		return 0;
	int d = TERN_UNDEFINED;
	if (o == (PyObject *)&PyFloat_Type)
		d = TERN_DOUBLE;
	else if (o == (PyObject *)&PyBool_Type)
		d = TERN_BOOL;
	else if (o == (PyObject *)&PyLong_Type)
		d = TERN_INT64;
	else if (PyLong_Check(o)) {
		long v = PyLong_AsLong(o);
		if (v == -1 && PyErr_Occurred())
			return -1;
		d = v > 0 && v < TERN_DTYPE_COUNT && v != TERN_STRING ? (int)v : TERN_UNDEFINED;
	} else {
		PyObject *s = NULL;
		if (PyUnicode_Check(o))
			s = Py_NewRef(o);
		else if (PyType_Check(o))
			s = PyObject_GetAttrString(o, "__name__"); /* numpy.float32 */
		else if (PyObject_HasAttrString(o, "name") && !Tensor_Check(o))
			s = PyObject_GetAttrString(o, "name"); /* numpy.dtype('float32') */
		else
			s = PyObject_Str(o); /* torch.float32 */
		if (!s)
			return -1;
		const char *c = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
		if (c)
			d = dtype_from_str(c);
		Py_DECREF(s);
		if (!c && PyErr_Occurred())
			return -1;
	}
	if (d == TERN_UNDEFINED) {
		PyErr_Format(PyExc_TypeError, "not a tern dtype: %R", o);
		return -1;
	}
	*out = d;
	return 0;
}

/* ---------------------------------------------------------------- calls */

/* The context a call on these inputs runs in: the first input's (so a tensor of a freed context
 * fails with tern's message), or the module's. */
static tern_ctx *ctx_of(tern_var *const *in, int n_in)
{
	for (int i = 0; i < n_in; i++)
		if (in[i])
			return tern_var_ctx(in[i]);
	return g_ctx;
}

/* An ONNX operator's first output as a new reference in *out. */
static int run1(const char *op, tern_var *const *in, int n_in, const tern_attr_arg *attrs, int n_attrs, tern_var **out)
{
	*out = NULL;
	tern_status rc = tern_call(ctx_of(in, n_in), "", op, in, n_in, attrs, n_attrs, out, 1);
	if (rc)
		return fail_status(rc);
	if (!*out) {
		PyErr_Format(g_error, "%s left its output out", op);
		return -1;
	}
	return 0;
}

static PyObject *wrap_as(PyTypeObject *type, tern_var *v);

/* run1, wrapped as a Tensor. */
static PyObject *run1_obj(const char *op, tern_var *const *in, int n_in, const tern_attr_arg *attrs, int n_attrs)
{
	tern_var *out;
	if (run1(op, in, n_in, attrs, n_attrs, &out) < 0)
		return NULL;
	return wrap_as(&TensorType, out);
}

/* A 1-D int64 tensor (shapes, axes, starts: what ONNX takes as inputs). To the trace-only baseline
 * they are the step's input, as sizes are to torch.jit.trace, which follows them. */
static int ints_var(tern_ctx *ctx, const int64_t *v, int n, tern_var **out)
{
	int64_t dims[1] = {n};
	tern_status rc = tern_var_from(ctx, TERN_INT64, 1, dims, v, out);
	if (rc)
		return fail_status(rc);
	tern_trace_input(*out);
	return 0;
}

/* x as dtype (a new reference; x itself when it has it already). */
static int cast_var(tern_var *x, int dtype, tern_var **out)
{
	if (tern_var_info(x)->dtype == dtype) {
		*out = tern_var_ref(x);
		return 0;
	}
	tern_attr_arg a = {.name = "to", .kind = TERN_ATTR_INT, .i = dtype};
	return run1("Cast", &x, 1, &a, 1, out);
}

enum { NUM_NONE, NUM_BOOL, NUM_INT, NUM_FLOAT };

/* Whether o is a number: Python's, or one of numpy's scalars (numpy.float32(2), numpy.int64(3)),
 * which are not arrays. */
static int number_kind(PyObject *o)
{
	if (PyBool_Check(o))
		return NUM_BOOL;
	if (PyLong_Check(o))
		return NUM_INT;
	if (PyFloat_Check(o))
		return NUM_FLOAT;
	if (Tensor_Check(o))
		return NUM_NONE;
	const char *tn = Py_TYPE(o)->tp_name;
	if (!strncmp(tn, "numpy.", 6) && strcmp(tn, "numpy.ndarray") != 0) {
		if (!strcmp(tn, "numpy.bool_") || !strcmp(tn, "numpy.bool"))
			return NUM_BOOL;
		if (PyIndex_Check(o))
			return NUM_INT;
		PyNumberMethods *nb = Py_TYPE(o)->tp_as_number;
		if (nb && nb->nb_float && !strstr(tn, "complex"))
			return NUM_FLOAT;
	}
	return NUM_NONE;
}

/* A 0-d tensor of dtype holding the number o. Types numpy has no C type for here (float16,
 * bfloat16, float8) go through float32 and Cast. */
static int scalar_var(tern_ctx *ctx, int dtype, PyObject *o, tern_var **out)
{
	union {
		float f;
		double d;
		int8_t i8;
		int16_t i16;
		int32_t i32;
		int64_t i64;
		uint8_t u8;
		uint16_t u16;
		uint32_t u32;
		uint64_t u64;
		float c64[2];
		double c128[2];
	} u;
	memset(&u, 0, sizeof u);
	int64_t dims[1] = {1};
	int kind = number_kind(o);
	if (is_float(dtype) || is_complex(dtype)) {
		double d;
		Py_complex c = {0, 0};
		if (is_complex(dtype) && PyComplex_Check(o))
			c = PyComplex_AsCComplex(o);
		else
			c.real = PyFloat_AsDouble(o);
		if (PyErr_Occurred())
			return -1;
		d = c.real;
		switch (dtype) {
		case TERN_DOUBLE: u.d = d; break;
		case TERN_COMPLEX64:
			u.c64[0] = (float)c.real;
			u.c64[1] = (float)c.imag;
			break;
		case TERN_COMPLEX128:
			u.c128[0] = c.real;
			u.c128[1] = c.imag;
			break;
		default: u.f = (float)d; break;
		}
		int direct = dtype == TERN_FLOAT || dtype == TERN_DOUBLE || is_complex(dtype);
		tern_var *v;
		tern_status rc = tern_var_from(ctx, direct ? dtype : TERN_FLOAT, 0, dims, &u, &v);
		if (rc)
			return fail_status(rc);
		if (direct) {
			*out = v;
			return 0;
		}
		int r = cast_var(v, dtype, out);
		tern_var_unref(v);
		return r;
	}
	if (dtype == TERN_BOOL) {
		int t = PyObject_IsTrue(o);
		if (t < 0)
			return -1;
		u.u8 = (uint8_t)t;
	} else if (is_int(dtype)) {
		long long v;
		if (kind == NUM_FLOAT) {
			/* what numpy's astype does: truncation toward zero */
			double d = PyFloat_AsDouble(o);
			if (d == -1.0 && PyErr_Occurred())
				return -1;
			v = (long long)d;
		} else {
			PyObject *idx = PyNumber_Index(o);
			if (!idx)
				return -1;
			int overflow = 0;
			v = PyLong_AsLongLongAndOverflow(idx, &overflow);
			if (overflow > 0 && dtype == TERN_UINT64) {
				u.u64 = PyLong_AsUnsignedLongLong(idx);
				Py_DECREF(idx);
				if (PyErr_Occurred())
					return -1;
				goto made;
			}
			Py_DECREF(idx);
			if (overflow) {
				PyErr_SetString(PyExc_OverflowError, "integer out of the range of int64");
				return -1;
			}
			if (v == -1 && PyErr_Occurred())
				return -1;
		}
		/* out-of-range values wrap, as numpy's casts do */
		switch (dtype) {
		case TERN_INT8: u.i8 = (int8_t)v; break;
		case TERN_INT16: u.i16 = (int16_t)v; break;
		case TERN_INT32: u.i32 = (int32_t)v; break;
		case TERN_INT64: u.i64 = (int64_t)v; break;
		case TERN_UINT8: u.u8 = (uint8_t)v; break;
		case TERN_UINT16: u.u16 = (uint16_t)v; break;
		case TERN_UINT32: u.u32 = (uint32_t)v; break;
		default: u.u64 = (uint64_t)v; break;
		}
	} else {
		PyErr_Format(PyExc_TypeError, "a number cannot be a %s tensor", dtype_str(dtype));
		return -1;
	}
made:;
	tern_status rc = tern_var_from(ctx, dtype, 0, dims, &u, out);
	return rc ? fail_status(rc) : 0;
}

/* ---------------------------------------------------------------- conversions */

/* The element type of a buffer-protocol format ("f", "<d", "l", "Zf", ...), by kind and item size
 * (numpy's int64 is "l" here, "q" elsewhere). TERN_UNDEFINED when tern has no such type. */
static int format_dtype(const char *f, Py_ssize_t itemsize)
{
	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	else if (*f == '>' || *f == '!')
		return TERN_UNDEFINED; /* big-endian: would need byte swapping */
	if (f[0] == 'Z' && f[1] && !f[2])
		return f[1] == 'f' ? TERN_COMPLEX64 : f[1] == 'd' ? TERN_COMPLEX128 : TERN_UNDEFINED;
	if (!f[0] || f[1])
		return TERN_UNDEFINED;
	switch (f[0]) {
	case 'f': return itemsize == 4 ? TERN_FLOAT : TERN_UNDEFINED;
	case 'd': return itemsize == 8 ? TERN_DOUBLE : TERN_UNDEFINED;
	case 'e': return itemsize == 2 ? TERN_FLOAT16 : TERN_UNDEFINED;
	case '?': return itemsize == 1 ? TERN_BOOL : TERN_UNDEFINED;
	case 'b':
	case 'h':
	case 'i':
	case 'l':
	case 'q':
	case 'n':
		switch (itemsize) {
		case 1: return TERN_INT8;
		case 2: return TERN_INT16;
		case 4: return TERN_INT32;
		case 8: return TERN_INT64;
		default: return TERN_UNDEFINED;
		}
	case 'B':
	case 'H':
	case 'I':
	case 'L':
	case 'Q':
	case 'N':
		switch (itemsize) {
		case 1: return TERN_UINT8;
		case 2: return TERN_UINT16;
		case 4: return TERN_UINT32;
		case 8: return TERN_UINT64;
		default: return TERN_UNDEFINED;
		}
	default: return TERN_UNDEFINED;
	}
}

/* A tensor holding a copy of what an object exporting the buffer protocol holds. */
static int var_from_buffer(PyObject *o, tern_var **out)
{
	Py_buffer view;
	if (PyObject_GetBuffer(o, &view, PyBUF_RECORDS_RO) < 0)
		return -1;
	int r = -1;
	void *tmp = NULL;
	int dtype = format_dtype(view.format ? view.format : "B", view.itemsize);
	if (dtype == TERN_UNDEFINED || tern_dtype_size(dtype) != (size_t)view.itemsize) {
		PyErr_Format(PyExc_TypeError, "tern.tensor: no tern type for the buffer format '%s' of a %s",
		             view.format ? view.format : "B", Py_TYPE(o)->tp_name);
		goto done;
	}
	if (view.ndim > TERN_MAX_RANK) {
		PyErr_Format(PyExc_ValueError, "tern.tensor: %d dimensions (at most %d)", view.ndim, TERN_MAX_RANK);
		goto done;
	}
	int64_t dims[TERN_MAX_RANK] = {0};
	for (int i = 0; i < view.ndim; i++)
		dims[i] = view.shape ? (int64_t)view.shape[i] : (int64_t)(view.len / view.itemsize);
	const void *data = view.buf;
	if (!PyBuffer_IsContiguous(&view, 'C')) {
		if (!(tmp = PyMem_Malloc(view.len ? (size_t)view.len : 1))) {
			PyErr_NoMemory();
			goto done;
		}
		if (PyBuffer_ToContiguous(tmp, &view, view.len, 'C') < 0)
			goto done;
		data = tmp;
	}
	tern_status rc = tern_var_from(g_ctx, dtype, view.ndim, dims, data, out);
	if (rc)
		raise_status(rc);
	else
		r = 0;
done:
	PyMem_Free(tmp);
	PyBuffer_Release(&view);
	return r;
}

/* A new tensor from an array-like (tern.tensor's rules): a Tensor is copied (no history), an
 * object with the buffer protocol (numpy arrays and scalars) keeps its type, Python numbers and
 * nested lists go through numpy.asarray with floats as float32 and ints as int64 (torch's
 * defaults). dtype TERN_UNDEFINED: that type; anything else: cast to it. */
static int var_from_object(PyObject *o, int dtype, tern_var **out)
{
	tern_var *v = NULL;
	*out = NULL;
	if (Tensor_Check(o)) {
		const tern_tensor *t = tern_var_tensor(VAR(o));
		if (t->dtype == TERN_STRING) {
			PyErr_SetString(PyExc_TypeError, "string tensors cannot be copied");
			return -1;
		}
		tern_status rc = tern_var_from(g_ctx, t->dtype, t->rank, t->dims, t->data, &v);
		if (rc)
			return fail_status(rc);
	} else if (PyObject_CheckBuffer(o) && !PyUnicode_Check(o)) {
		if (var_from_buffer(o, &v) < 0)
			return -1;
	} else if (number_kind(o)) {
		int kind = number_kind(o);
		int d = dtype != TERN_UNDEFINED ? dtype
		        : kind == NUM_BOOL      ? TERN_BOOL
		        : kind == NUM_INT       ? TERN_INT64
		                                : TERN_FLOAT;
		return scalar_var(g_ctx, d, o, out);
	} else {
		PyObject *np = PyImport_ImportModule("numpy");
		if (!np)
			return -1;
		PyObject *arr = PyObject_CallMethod(np, "asarray", "(O)", o);
		Py_DECREF(np);
		if (!arr)
			return -1;
		int r = var_from_buffer(arr, &v);
		Py_DECREF(arr);
		if (r < 0)
			return -1;
		/* Python floats are float32 unless asked otherwise; an object numpy converts by its
		 * __array__ (a torch tensor) keeps its type */
		if (dtype == TERN_UNDEFINED && tern_var_info(v)->dtype == TERN_DOUBLE &&
		    (PyList_Check(o) || PyTuple_Check(o)))
			dtype = TERN_FLOAT;
	}
	if (dtype == TERN_UNDEFINED || dtype == tern_var_info(v)->dtype) {
		*out = v;
		return 0;
	}
	int r = cast_var(v, dtype, out);
	tern_var_unref(v);
	return r;
}

/* ---------------------------------------------------------------- Tensor: lifetime */

/* A Tensor (or subtype) object owning v; v is released when that fails. */
static PyObject *wrap_as(PyTypeObject *type, tern_var *v)
{
	TensorObject *self = (TensorObject *)type->tp_alloc(type, 0);
	if (!self) {
		tern_var_unref(v);
		return NULL;
	}
	self->var = v;
	return (PyObject *)self;
}

static PyObject *wrap(tern_var *v)
{
	return wrap_as(&TensorType, v);
}

static void tensor_dealloc(TensorObject *self)
{
	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	tern_var_unref(self->var);
	self->var = NULL;
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Shared by Tensor(...) and Parameter(...): data converted with tern.tensor's rules. */
static PyObject *tensor_make(PyTypeObject *type, PyObject *data, PyObject *dtype_obj, int requires_grad, int param)
{
	int dtype = TERN_UNDEFINED;
	if (parse_dtype(dtype_obj, &dtype) < 0)
		return NULL;
	tern_var *v = NULL;
	if (!data || data == Py_None) {
		int64_t dims[1] = {0};
		tern_status rc = tern_var_new(g_ctx, dtype ? dtype : TERN_FLOAT, 1, dims, &v);
		if (rc)
			return raise_status(rc);
	} else if (param && Tensor_Check(data) &&
	           (dtype == TERN_UNDEFINED || dtype == tern_var_info(VAR(data))->dtype)) {
		/* Parameter(t): torch's rule, the same bytes as a new leaf */
		v = tern_var_detach(VAR(data));
		if (!v)
			return PyErr_NoMemory();
	} else {
		/* a Parameter is float32 unless asked otherwise, from float64 arrays too (numpy's default
		 * type would make float64 parameters beside float32 inputs) */
		if (param && dtype == TERN_UNDEFINED && !Tensor_Check(data)) {
			if (var_from_object(data, TERN_UNDEFINED, &v) < 0)
				return NULL;
			if (tern_var_info(v)->dtype == TERN_DOUBLE) {
				tern_var *f;
				int r = cast_var(v, TERN_FLOAT, &f);
				tern_var_unref(v);
				if (r < 0)
					return NULL;
				v = f;
			}
		} else if (var_from_object(data, dtype, &v) < 0) {
			return NULL;
		}
	}
	if (requires_grad) {
		tern_status rc = tern_var_set_requires_grad(v, 1);
		if (rc) {
			tern_var_unref(v);
			return raise_status(rc);
		}
	}
	return wrap_as(type, v);
}

static PyObject *tensor_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
	static char *kwlist[] = {"data", "dtype", "requires_grad", NULL};
	PyObject *data = NULL, *dtype = Py_None;
	int requires_grad = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OOp:Tensor", kwlist, &data, &dtype, &requires_grad))
		return NULL;
	return tensor_make(type, data, dtype, requires_grad, 0);
}

static PyObject *parameter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
	static char *kwlist[] = {"data", "requires_grad", "dtype", NULL};
	PyObject *data = NULL, *dtype = Py_None;
	int requires_grad = 1;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OpO:Parameter", kwlist, &data, &requires_grad, &dtype))
		return NULL;
	return tensor_make(type, data, dtype, requires_grad, 1);
}

/* ---------------------------------------------------------------- Tensor: the buffer protocol */

static char empty_buffer[16];

typedef struct buffer_info {
	tern_var *var;
	Py_ssize_t sh[];
} buffer_info;

static int tensor_getbuffer(TensorObject *self, Py_buffer *view, int flags)
{
	tern_trace_fetch(self->var); /* the host reads it */
	const tern_tensor *t = tern_var_tensor(self->var);
	const struct dtype_info *d = dtype_info(t->dtype);
	view->obj = NULL;
	if (!d || !d->format) {
		PyErr_Format(PyExc_BufferError, "a %s tensor has no buffer format (convert it with .float() first)",
		             dtype_str(t->dtype));
		return -1;
	}
	int rank = t->rank;
	/* shape and strides, and a reference to the tensor whose bytes these are, live as long as the
	 * view: released by releasebuffer */
	buffer_info *bi = PyMem_Malloc(sizeof *bi + sizeof *bi->sh * 2 * (size_t)(rank ? rank : 1));
	if (!bi) {
		PyErr_NoMemory();
		return -1;
	}
	bi->var = tern_var_ref(self->var);
	Py_ssize_t *sh = bi->sh;
	Py_ssize_t itemsize = (Py_ssize_t)tern_dtype_size(t->dtype), stride = itemsize;
	for (int i = rank - 1; i >= 0; i--) {
		sh[i] = (Py_ssize_t)t->dims[i];
		sh[rank + i] = stride;
		stride *= sh[i];
	}
	view->buf = t->data ? t->data : empty_buffer;
	view->obj = Py_NewRef(self);
	view->len = (Py_ssize_t)tern_tensor_numel(t) * itemsize;
	/* writable: tern_var_tensor's bytes may be written (numpy interop); autograd does not see it */
	view->readonly = 0;
	view->itemsize = itemsize;
	view->format = (flags & PyBUF_FORMAT) ? (char *)d->format : NULL;
	view->ndim = rank;
	view->shape = (flags & PyBUF_ND) == PyBUF_ND ? sh : NULL;
	view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? sh + rank : NULL;
	view->suboffsets = NULL;
	view->internal = bi;
	return 0;
}

static void tensor_releasebuffer(TensorObject *self, Py_buffer *view)
{
	buffer_info *bi = view->internal;
	if (bi)
		tern_var_unref(bi->var);
	PyMem_Free(bi);
	view->internal = NULL;
}

static PyBufferProcs tensor_as_buffer = {
        .bf_getbuffer = (getbufferproc)tensor_getbuffer,
        .bf_releasebuffer = (releasebufferproc)tensor_releasebuffer,
};

/* ---------------------------------------------------------------- Tensor: values */

/* A numpy array holding a copy of the tensor. bfloat16 and float8 become float32 (numpy has no
 * such types), strings an object array of str. */
static PyObject *tensor_numpy(TensorObject *self, PyObject *unused)
{
	tern_trace_fetch(self->var); /* the host reads it */
	const tern_tensor *t = tern_var_tensor(self->var);
	PyObject *np = PyImport_ImportModule("numpy");
	if (!np)
		return NULL;
	PyObject *arr = NULL;
	if (t->dtype == TERN_STRING) {
		int64_t n = tern_tensor_numel(t);
		PyObject *list = PyList_New((Py_ssize_t)n), *shape = PyTuple_New(t->rank);
		for (int64_t i = 0; list && shape && i < n; i++) {
			const char *s = ((char *const *)t->data)[i];
			PyObject *item = PyUnicode_DecodeUTF8(s ? s : "", s ? (Py_ssize_t)strlen(s) : 0, "replace");
			if (!item)
				goto strings_done;
			PyList_SET_ITEM(list, (Py_ssize_t)i, item);
		}
		for (int i = 0; list && shape && i < t->rank; i++) {
			PyObject *dim = PyLong_FromLongLong(t->dims[i]);
			if (!dim)
				goto strings_done;
			PyTuple_SET_ITEM(shape, i, dim);
		}
		if (list && shape) {
			PyObject *flat = PyObject_CallMethod(np, "array", "Os", list, "object");
			if (flat) {
				arr = PyObject_CallMethod(flat, "reshape", "(O)", shape);
				Py_DECREF(flat);
			}
		}
	strings_done:
		Py_XDECREF(list);
		Py_XDECREF(shape);
		Py_DECREF(np);
		return arr;
	}
	const struct dtype_info *d = dtype_info(t->dtype);
	PyObject *src;
	if (!d || !d->format) {
		tern_var *f;
		int was = tern_ctx_set_grad_enabled(tern_var_ctx(self->var), 0);
		int r = cast_var(self->var, TERN_FLOAT, &f);
		tern_ctx_set_grad_enabled(tern_var_ctx(self->var), was);
		if (r < 0) {
			Py_DECREF(np);
			return NULL;
		}
		src = wrap(f);
	} else {
		src = Py_NewRef(self);
	}
	PyObject *mv = src ? PyMemoryView_FromObject(src) : NULL;
	Py_XDECREF(src);
	if (mv) {
		arr = PyObject_CallMethod(np, "array", "(O)", mv); /* numpy.array copies */
		Py_DECREF(mv);
	}
	Py_DECREF(np);
	return arr;
}

static int check_one(const tern_tensor *t, const char *what)
{
	if (tern_tensor_numel(t) != 1) {
		char buf[160];
		PyErr_Format(PyExc_ValueError, "%s needs a tensor of one element, not %s", what,
		             tern_shape_str(t->dtype, t->rank, t->dims, buf, sizeof buf));
		return -1;
	}
	return 0;
}

static PyObject *tensor_item(TensorObject *self, PyObject *unused)
{
	tern_trace_fetch(self->var); /* the host reads it */
	const tern_tensor *t = tern_var_tensor(self->var);
	if (check_one(t, "item()") < 0)
		return NULL;
	if (is_float(t->dtype))
		return PyFloat_FromDouble(tern_tensor_get_f64(t, 0));
	if (t->dtype == TERN_BOOL)
		return PyBool_FromLong(((const uint8_t *)t->data)[0] != 0);
	if (t->dtype == TERN_UINT64)
		return PyLong_FromUnsignedLongLong(((const uint64_t *)t->data)[0]);
	if (is_int(t->dtype))
		return PyLong_FromLongLong(tern_tensor_get_i64(t, 0));
	if (t->dtype == TERN_COMPLEX64)
		return PyComplex_FromDoubles(((const float *)t->data)[0], ((const float *)t->data)[1]);
	if (t->dtype == TERN_COMPLEX128)
		return PyComplex_FromDoubles(((const double *)t->data)[0], ((const double *)t->data)[1]);
	if (t->dtype == TERN_STRING) {
		const char *s = ((char *const *)t->data)[0];
		return PyUnicode_DecodeUTF8(s ? s : "", s ? (Py_ssize_t)strlen(s) : 0, "replace");
	}
	PyErr_Format(PyExc_TypeError, "item() of a %s tensor", dtype_str(t->dtype));
	return NULL;
}

static PyObject *tensor_tolist(TensorObject *self, PyObject *unused)
{
	PyObject *arr = tensor_numpy(self, NULL);
	if (!arr)
		return NULL;
	PyObject *r = PyObject_CallMethod(arr, "tolist", NULL);
	Py_DECREF(arr);
	return r;
}

static PyObject *tensor_float_value(TensorObject *self)
{
	tern_trace_fetch(self->var); /* the host reads it */
	const tern_tensor *t = tern_var_tensor(self->var);
	if (check_one(t, "float()") < 0)
		return NULL;
	if (t->dtype == TERN_STRING || is_complex(t->dtype)) {
		PyErr_Format(PyExc_TypeError, "float() of a %s tensor", dtype_str(t->dtype));
		return NULL;
	}
	return PyFloat_FromDouble(tern_tensor_get_f64(t, 0));
}

static PyObject *tensor_int_value(TensorObject *self)
{
	tern_trace_fetch(self->var); /* the host reads it */
	const tern_tensor *t = tern_var_tensor(self->var);
	if (check_one(t, "int()") < 0)
		return NULL;
	if (t->dtype == TERN_STRING || is_complex(t->dtype)) {
		PyErr_Format(PyExc_TypeError, "int() of a %s tensor", dtype_str(t->dtype));
		return NULL;
	}
	if (is_float(t->dtype))
		return PyLong_FromDouble(tern_tensor_get_f64(t, 0));
	if (t->dtype == TERN_UINT64)
		return PyLong_FromUnsignedLongLong(((const uint64_t *)t->data)[0]);
	return PyLong_FromLongLong(tern_tensor_get_i64(t, 0));
}

/* operator.index(t): only integer tensors of one element, as torch has it. */
static PyObject *tensor_index_value(TensorObject *self)
{
	tern_trace_fetch(self->var); /* the host reads it */
	const tern_tensor *t = tern_var_tensor(self->var);
	if (!is_int(t->dtype) || tern_tensor_numel(t) != 1) {
		PyErr_SetString(PyExc_TypeError, "only integer tensors of one element can be converted to an index");
		return NULL;
	}
	return tensor_int_value(self);
}

static int tensor_bool_value(TensorObject *self)
{
	tern_trace_fetch(self->var); /* the host reads it */
	const tern_tensor *t = tern_var_tensor(self->var);
	if (tern_tensor_numel(t) != 1) {
		PyErr_SetString(PyExc_ValueError,
		                "the truth value of a tensor of more or fewer than one element is ambiguous");
		return -1;
	}
	if (t->dtype == TERN_STRING || is_complex(t->dtype)) {
		PyErr_Format(PyExc_TypeError, "bool() of a %s tensor", dtype_str(t->dtype));
		return -1;
	}
	if (is_float(t->dtype))
		return tern_tensor_get_f64(t, 0) != 0;
	return tern_tensor_get_i64(t, 0) != 0;
}

static PyObject *tensor_repr(TensorObject *self)
{
	tern_trace_fetch(self->var); /* the host reads it */
	const tern_tensor *t = tern_var_tensor(self->var);
	const char *tail = tern_var_requires_grad(self->var) ? ", requires_grad=True" : "";
	const struct dtype_info *d = dtype_info(t->dtype);
	char buf[160];
	if ((!d || !d->format) && t->dtype != TERN_STRING)
		return PyUnicode_FromFormat("tensor(<%s>%s)",
		                            tern_shape_str(t->dtype, t->rank, t->dims, buf, sizeof buf), tail);
	PyObject *np = NULL, *arr = NULL, *fn = NULL, *args = NULL, *kw = NULL, *s = NULL, *r = NULL;
	if (!(np = PyImport_ImportModule("numpy")) || !(arr = tensor_numpy(self, NULL)) ||
	    !(fn = PyObject_GetAttrString(np, "array2string")) || !(args = PyTuple_Pack(1, arr)) ||
	    !(kw = Py_BuildValue("{s:s,s:s}", "separator", ", ", "prefix", "tensor(")) ||
	    !(s = PyObject_Call(fn, args, kw)))
		goto done;
	r = PyUnicode_FromFormat("tensor(%U, dtype=%s%s)", s, dtype_str(t->dtype), tail);
done:
	Py_XDECREF(np);
	Py_XDECREF(arr);
	Py_XDECREF(fn);
	Py_XDECREF(args);
	Py_XDECREF(kw);
	Py_XDECREF(s);
	return r;
}

static Py_hash_t tensor_hash(PyObject *self)
{
	/* by identity, as torch's tensors: == is elementwise, so equal tensors need not hash alike */
	Py_hash_t h = (Py_hash_t)((uintptr_t)self >> 4);
	return h == -1 ? -2 : h;
}

/* ---------------------------------------------------------------- Tensor: properties */

static PyObject *shape_tuple(const tern_tensor *t)
{
	PyObject *r = PyTuple_New(t->rank);
	for (int i = 0; r && i < t->rank; i++) {
		PyObject *d = PyLong_FromLongLong(t->dims[i]);
		if (!d) {
			Py_CLEAR(r);
			break;
		}
		PyTuple_SET_ITEM(r, i, d);
	}
	return r;
}

static PyObject *tensor_get_shape(TensorObject *self, void *closure)
{
	return shape_tuple(tern_var_info(self->var));
}

static PyObject *tensor_get_dtype(TensorObject *self, void *closure)
{
	return PyUnicode_FromString(dtype_str(tern_var_info(self->var)->dtype));
}

static PyObject *tensor_get_ndim(TensorObject *self, void *closure)
{
	return PyLong_FromLong(tern_var_info(self->var)->rank);
}

static PyObject *tensor_get_requires_grad(TensorObject *self, void *closure)
{
	return PyBool_FromLong(tern_var_requires_grad(self->var));
}

static int tensor_set_requires_grad(TensorObject *self, PyObject *value, void *closure)
{
	if (!value) {
		PyErr_SetString(PyExc_AttributeError, "requires_grad cannot be deleted");
		return -1;
	}
	int on = PyObject_IsTrue(value);
	if (on < 0)
		return -1;
	tern_status rc = tern_var_set_requires_grad(self->var, on);
	return rc ? fail_status(rc) : 0;
}

static PyObject *tensor_get_grad(TensorObject *self, void *closure)
{
	tern_var *g = tern_var_grad(self->var);
	if (!g)
		Py_RETURN_NONE;
	return wrap(tern_var_ref(g));
}

static int tensor_set_grad(TensorObject *self, PyObject *value, void *closure)
{
	if (!value || value == Py_None) {
		tern_var_set_grad(self->var, NULL);
		return 0;
	}
	if (!Tensor_Check(value)) {
		PyErr_SetString(PyExc_TypeError, "grad must be a Tensor or None");
		return -1;
	}
	const tern_tensor *t = tern_var_info(self->var), *g = tern_var_info(VAR(value));
	if (t->dtype != g->dtype || t->rank != g->rank || memcmp(t->dims, g->dims, (size_t)t->rank * sizeof *t->dims)) {
		char a[160], b[160];
		PyErr_Format(PyExc_ValueError, "grad: a gradient of %s for a tensor of %s",
		             tern_shape_str(g->dtype, g->rank, g->dims, a, sizeof a),
		             tern_shape_str(t->dtype, t->rank, t->dims, b, sizeof b));
		return -1;
	}
	tern_var_set_grad(self->var, VAR(value)); /* takes its own reference */
	return 0;
}

static PyObject *tensor_get_is_leaf(TensorObject *self, void *closure)
{
	return PyBool_FromLong(tern_var_is_leaf(self->var));
}

static PyObject *tensor_detach(TensorObject *self, PyObject *unused)
{
	tern_var *v = tern_var_detach(self->var);
	if (!v)
		return PyErr_NoMemory();
	return wrap(v);
}

static PyObject *tensor_get_data(TensorObject *self, void *closure)
{
	return tensor_detach(self, NULL);
}

static PyObject *tensor_get_T(TensorObject *self, void *closure)
{
	return run1_obj("Transpose", &self->var, 1, NULL, 0);
}

static PyObject *tensor_get_device(TensorObject *self, void *closure)
{
	return PyUnicode_FromString("cpu");
}

static PyGetSetDef tensor_getset[] = {
        {"shape", (getter)tensor_get_shape, NULL, "The dimensions, a tuple of ints.", NULL},
        {"dtype", (getter)tensor_get_dtype, NULL, "The element type's name: 'float32', 'int64', 'bool', ...", NULL},
        {"ndim", (getter)tensor_get_ndim, NULL, "The number of dimensions.", NULL},
        {"requires_grad", (getter)tensor_get_requires_grad, (setter)tensor_set_requires_grad,
         "Whether operations on the tensor are recorded for backward(). Only a floating-point leaf can be set.", NULL},
        {"grad", (getter)tensor_get_grad, (setter)tensor_set_grad,
         "The gradient backward() accumulated (a Tensor), or None; can be set to a tensor of the same shape or None.",
         NULL},
        {"is_leaf", (getter)tensor_get_is_leaf, NULL, "Whether no recorded operation made the tensor.", NULL},
        {"data", (getter)tensor_get_data, NULL, "The tensor without history (detach()): the same bytes.", NULL},
        {"T", (getter)tensor_get_T, NULL, "The tensor with its dimensions reversed (Transpose).", NULL},
        {"device", (getter)tensor_get_device, NULL, "Where the bytes live: 'cpu'.", NULL},
        {NULL},
};

/* ---------------------------------------------------------------- Tensor: operators */

/* The other operand of an arithmetic or comparison operator as a tensor beside *x: a Tensor as it
 * is, a Python or numpy number as a 0-d tensor of x's type, an array or a list converted to x's
 * type. A float number beside an integer or bool tensor makes both float32, and (arithmetic) an
 * integer beside a bool tensor makes both int64: torch's promotions, since ONNX's operators take
 * one type. Returns 0, -1 with an exception, or 1 when o is no operand (NotImplemented). */
static int operand(PyObject *o, tern_var **x, tern_var **y, int arith)
{
	*y = NULL;
	int xd = tern_var_info(*x)->dtype;
	if (Tensor_Check(o)) {
		*y = tern_var_ref(VAR(o));
		return 0;
	}
	int kind = number_kind(o);
	if (kind) {
		int d = xd;
		if (kind == NUM_FLOAT && !is_float(xd) && !is_complex(xd))
			d = TERN_FLOAT;
		else if (arith && kind == NUM_INT && xd == TERN_BOOL)
			d = TERN_INT64;
		if (d != xd) {
			tern_var *cx;
			if (cast_var(*x, d, &cx) < 0)
				return -1;
			tern_var_unref(*x);
			*x = cx;
		}
		return scalar_var(tern_var_ctx(*x), d, o, y);
	}
	if (PyUnicode_Check(o) || PyBytes_Check(o) || o == Py_None)
		return 1;
	if (PyObject_CheckBuffer(o) || PyList_Check(o) || PyTuple_Check(o))
		return var_from_object(o, xd, y);
	return 1;
}

/* OP_PROMOTE: two tensors of different types meet in promote()'s (x * (x > 0), int + float);
 * matrix products and powers take their operands as they are, as ONNX has them. */
enum { OP_ARITH = 1, OP_TRUEDIV = 2, OP_NOT = 4, OP_PROMOTE = 8 };

/* The type two tensors of different types meet in, as torch promotes them: bool below the integers
 * below the floating-point types, and the wider of two of a kind. */
static int promote(int a, int b)
{
	if (a == b || a == TERN_STRING || b == TERN_STRING || is_complex(a) || is_complex(b))
		return a;
	if (a == TERN_BOOL || b == TERN_BOOL)
		return a == TERN_BOOL ? b : a;
	if (is_float(a) != is_float(b))
		return is_float(a) ? a : b;
	if (is_float(a)) {
		if (a == TERN_DOUBLE || b == TERN_DOUBLE)
			return TERN_DOUBLE;
		return a == TERN_FLOAT || b == TERN_FLOAT || tern_dtype_size(a) == tern_dtype_size(b) ? TERN_FLOAT
		        : tern_dtype_size(a) > tern_dtype_size(b)                                     ? a
		                                                                                      : b;
	}
	size_t sa = tern_dtype_size(a), sb = tern_dtype_size(b);
	return sa == sb ? TERN_INT64 : sa > sb ? a : b;
}

static PyObject *binary(PyObject *a, PyObject *b, const char *op, int flags)
{
	int self_first = Tensor_Check(a);
	PyObject *self = self_first ? a : b, *other = self_first ? b : a;
	if (!Tensor_Check(self))
		Py_RETURN_NOTIMPLEMENTED;
	tern_var *x = tern_var_ref(VAR(self)), *y = NULL, *r = NULL;
	PyObject *result = NULL;
	int st = operand(other, &x, &y, flags & OP_ARITH);
	if (st > 0) {
		tern_var_unref(x);
		Py_RETURN_NOTIMPLEMENTED;
	}
	if (st < 0)
		goto done;
	int xd = tern_var_info(x)->dtype, yd = tern_var_info(y)->dtype;
	if ((flags & OP_PROMOTE) && xd != yd) {
		int d = promote(xd, yd);
		tern_var *c;
		if (xd != d) {
			if (cast_var(x, d, &c) < 0)
				goto done;
			tern_var_unref(x);
			x = c;
		}
		if (yd != d) {
			if (cast_var(y, d, &c) < 0)
				goto done;
			tern_var_unref(y);
			y = c;
		}
	}
	/* `/` is true division, as Python's and torch's: integers divide as float32 */
	if ((flags & OP_TRUEDIV) && !is_float(tern_var_info(x)->dtype) && !is_complex(tern_var_info(x)->dtype)) {
		tern_var *cx, *cy;
		if (cast_var(x, TERN_FLOAT, &cx) < 0)
			goto done;
		if (cast_var(y, TERN_FLOAT, &cy) < 0) {
			tern_var_unref(cx);
			goto done;
		}
		tern_var_unref(x);
		tern_var_unref(y);
		x = cx;
		y = cy;
	}
	tern_var *in[2] = {self_first ? x : y, self_first ? y : x};
	if (run1(op, in, 2, NULL, 0, &r) < 0)
		goto done;
	if (flags & OP_NOT) {
		tern_var *n;
		int rr = run1("Not", &r, 1, NULL, 0, &n);
		tern_var_unref(r);
		r = NULL;
		if (rr < 0)
			goto done;
		r = n;
	}
	result = wrap(r);
done:
	tern_var_unref(x);
	tern_var_unref(y);
	return result;
}

static PyObject *nb_add(PyObject *a, PyObject *b)
{
	return binary(a, b, "Add", OP_ARITH | OP_PROMOTE);
}
static PyObject *nb_sub(PyObject *a, PyObject *b)
{
	return binary(a, b, "Sub", OP_ARITH | OP_PROMOTE);
}
static PyObject *nb_mul(PyObject *a, PyObject *b)
{
	return binary(a, b, "Mul", OP_ARITH | OP_PROMOTE);
}
static PyObject *nb_truediv(PyObject *a, PyObject *b)
{
	return binary(a, b, "Div", OP_ARITH | OP_TRUEDIV | OP_PROMOTE);
}
static PyObject *nb_matmul(PyObject *a, PyObject *b)
{
	return binary(a, b, "MatMul", 0);
}
static PyObject *nb_mod(PyObject *a, PyObject *b)
{
	return binary(a, b, "Mod", OP_ARITH | OP_PROMOTE);
}

static PyObject *nb_pow(PyObject *a, PyObject *b, PyObject *mod)
{
	if (mod != Py_None) {
		PyErr_SetString(PyExc_TypeError, "pow() of a tensor takes no modulus");
		return NULL;
	}
	return binary(a, b, "Pow", OP_ARITH);
}

static PyObject *unary(TensorObject *self, const char *op)
{
	return run1_obj(op, &self->var, 1, NULL, 0);
}

static PyObject *nb_neg(PyObject *a)
{
	return unary((TensorObject *)a, "Neg");
}
static PyObject *nb_abs(PyObject *a)
{
	return unary((TensorObject *)a, "Abs");
}
static PyObject *nb_invert(PyObject *a)
{
	/* ~ of a bool tensor is Not, of an integer one BitwiseNot */
	return unary((TensorObject *)a, tern_var_info(VAR(a))->dtype == TERN_BOOL ? "Not" : "BitwiseNot");
}
static PyObject *nb_pos(PyObject *a)
{
	return Py_NewRef(a);
}
static PyObject *nb_float(PyObject *a)
{
	return tensor_float_value((TensorObject *)a);
}
static PyObject *nb_int(PyObject *a)
{
	return tensor_int_value((TensorObject *)a);
}
static PyObject *nb_index(PyObject *a)
{
	return tensor_index_value((TensorObject *)a);
}
static int nb_bool(PyObject *a)
{
	return tensor_bool_value((TensorObject *)a);
}

static PyObject *nb_and(PyObject *a, PyObject *b)
{
	PyObject *t = Tensor_Check(a) ? a : b;
	return binary(a, b, Tensor_Check(t) && tern_var_info(VAR(t))->dtype == TERN_BOOL ? "And" : "BitwiseAnd", 0);
}
static PyObject *nb_or(PyObject *a, PyObject *b)
{
	PyObject *t = Tensor_Check(a) ? a : b;
	return binary(a, b, Tensor_Check(t) && tern_var_info(VAR(t))->dtype == TERN_BOOL ? "Or" : "BitwiseOr", 0);
}
static PyObject *nb_xor(PyObject *a, PyObject *b)
{
	PyObject *t = Tensor_Check(a) ? a : b;
	return binary(a, b, Tensor_Check(t) && tern_var_info(VAR(t))->dtype == TERN_BOOL ? "Xor" : "BitwiseXor", 0);
}

/* a op= b: the result of a op b, written into a's bytes or, with a history, made a's (the hook) */
static PyObject *inplace(PyObject *a, PyObject *b, PyObject *(*f)(PyObject *, PyObject *), const char *name)
{
	PyObject *r = f(a, b);
	if (!r || r == Py_NotImplemented || !Tensor_Check(a) || !g_inplace_hook)
		return r;
	PyObject *res = PyObject_CallFunction(g_inplace_hook, "OOs", a, r, name);
	Py_DECREF(r);
	return res;
}
static PyObject *nb_iadd(PyObject *a, PyObject *b)
{
	return inplace(a, b, nb_add, "+=");
}
static PyObject *nb_isub(PyObject *a, PyObject *b)
{
	return inplace(a, b, nb_sub, "-=");
}
static PyObject *nb_imul(PyObject *a, PyObject *b)
{
	return inplace(a, b, nb_mul, "*=");
}
static PyObject *nb_itruediv(PyObject *a, PyObject *b)
{
	return inplace(a, b, nb_truediv, "/=");
}

static PyNumberMethods tensor_as_number = {
        .nb_inplace_add = nb_iadd,
        .nb_inplace_subtract = nb_isub,
        .nb_inplace_multiply = nb_imul,
        .nb_inplace_true_divide = nb_itruediv,
        .nb_add = nb_add,
        .nb_subtract = nb_sub,
        .nb_multiply = nb_mul,
        .nb_remainder = nb_mod,
        .nb_power = nb_pow,
        .nb_negative = nb_neg,
        .nb_positive = nb_pos,
        .nb_absolute = nb_abs,
        .nb_bool = nb_bool,
        .nb_invert = nb_invert,
        .nb_and = nb_and,
        .nb_xor = nb_xor,
        .nb_or = nb_or,
        .nb_int = nb_int,
        .nb_float = nb_float,
        .nb_true_divide = nb_truediv,
        .nb_index = nb_index,
        .nb_matrix_multiply = nb_matmul,
};

static PyObject *tensor_richcompare(PyObject *self, PyObject *other, int op)
{
	switch (op) {
	case Py_EQ: return binary(self, other, "Equal", OP_PROMOTE);
	case Py_NE: return binary(self, other, "Equal", OP_NOT | OP_PROMOTE);
	case Py_LT: return binary(self, other, "Less", OP_PROMOTE);
	case Py_LE: return binary(self, other, "LessOrEqual", OP_PROMOTE);
	case Py_GT: return binary(self, other, "Greater", OP_PROMOTE);
	case Py_GE: return binary(self, other, "GreaterOrEqual", OP_PROMOTE);
	default: Py_RETURN_NOTIMPLEMENTED;
	}
}

/* ---------------------------------------------------------------- Tensor: indexing */

/* Basic indexing as numpy has it, through differentiable operators: the integers and slices are
 * one Slice (an integer i is the slice i:i+1), whose integer axes one Squeeze removes; one index
 * that is an integer tensor or list is a Gather on its axis; None is an Unsqueeze of the result. */
/* A boolean mask as numpy reads one: a bool tensor, an array whose dtype is bool, a list of bools. */
static int is_bool_mask(PyObject *key)
{
	if (Tensor_Check(key))
		return tern_var_info(((TensorObject *)key)->var)->dtype == TERN_BOOL;
	if (PyList_Check(key))
		return PyList_GET_SIZE(key) > 0 && PyBool_Check(PyList_GET_ITEM(key, 0));
	if (PyTuple_Check(key) || PyLong_Check(key) || PySlice_Check(key) || key == Py_None || key == Py_Ellipsis)
		return 0;
	PyObject *dt = PyObject_GetAttrString(key, "dtype");
	if (!dt) {
		PyErr_Clear();
		return 0;
	}
	PyObject *kind = PyObject_GetAttrString(dt, "kind");
	Py_DECREF(dt);
	if (!kind) {
		PyErr_Clear();
		return 0;
	}
	int b = PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "b") == 0;
	Py_DECREF(kind);
	return b;
}

static PyObject *tensor_getitem(TensorObject *self, PyObject *key)
{
	if (g_mask_hook && is_bool_mask(key))
		return PyObject_CallFunctionObjArgs(g_mask_hook, (PyObject *)self, key, NULL);
	const tern_tensor *t = tern_var_info(self->var);
	int rank = t->rank;
	PyObject *items = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
	if (!items)
		return NULL;
	Py_ssize_t n = PyTuple_GET_SIZE(items);
	tern_var *cur = tern_var_ref(self->var), *adv = NULL;
	PyObject *result = NULL;
	int consumed = 0, ellipses = 0;
	for (Py_ssize_t k = 0; k < n; k++) {
		PyObject *it = PyTuple_GET_ITEM(items, k);
		if (it == Py_Ellipsis)
			ellipses++;
		else if (it != Py_None)
			consumed++;
	}
	if (ellipses > 1) {
		PyErr_SetString(PyExc_IndexError, "an index can only have a single ellipsis ('...')");
		goto done;
	}
	if (consumed > rank) {
		PyErr_Format(PyExc_IndexError, "too many indices for a tensor of %d dimensions: %d were indexed", rank,
		             consumed);
		goto done;
	}
	if (n > 2 * TERN_MAX_RANK) {
		PyErr_SetString(PyExc_IndexError, "too many None in the index");
		goto done;
	}
	int64_t starts[TERN_MAX_RANK], ends[TERN_MAX_RANK], axes[TERN_MAX_RANK], steps[TERN_MAX_RANK];
	int64_t squeeze[TERN_MAX_RANK], unsqueeze[2 * TERN_MAX_RANK];
	int n_slice = 0, n_squeeze = 0, n_unsqueeze = 0, adv_axis = -1;
	int ax = 0, pos = 0; /* the input axis, the output position */
	for (Py_ssize_t k = 0; k < n; k++) {
		PyObject *it = PyTuple_GET_ITEM(items, k);
		if (it == Py_None) {
			unsqueeze[n_unsqueeze++] = pos++;
		} else if (it == Py_Ellipsis) {
			ax += rank - consumed;
			pos += rank - consumed;
		} else if (PySlice_Check(it)) {
			Py_ssize_t start, stop, step, dim = (Py_ssize_t)t->dims[ax];
			if (PySlice_Unpack(it, &start, &stop, &step) < 0)
				goto done;
			Py_ssize_t len = PySlice_AdjustIndices(dim, &start, &stop, step);
			if (len == 0) {
				starts[n_slice] = 0, ends[n_slice] = 0, steps[n_slice] = 1;
				axes[n_slice++] = ax;
			} else if (!(start == 0 && stop == dim && step == 1)) {
				/* a negative step's "before the first" is -1 here, and -dim-1 for ONNX (which adds
				 * dim) */
				starts[n_slice] = start;
				ends[n_slice] = step < 0 && stop < 0 ? -(int64_t)dim - 1 : stop;
				steps[n_slice] = step;
				axes[n_slice++] = ax;
			}
			ax++;
			pos++;
		} else if (Tensor_Check(it) || PyList_Check(it) ||
		           (PyObject_CheckBuffer(it) && number_kind(it) != NUM_INT)) {
			/* (numpy's arrays have __index__ too, for one element: they are tensors here) */
			if (adv) {
				PyErr_SetString(PyExc_IndexError, "only one index may be a tensor or a list");
				goto done;
			}
			tern_var *iv;
			if (Tensor_Check(it))
				iv = tern_var_ref(VAR(it));
			else if (var_from_object(it, TERN_UNDEFINED, &iv) < 0)
				goto done;
			int d = tern_var_info(iv)->dtype;
			if (!is_int(d)) {
				tern_var_unref(iv);
				PyErr_Format(PyExc_IndexError,
				             "a tensor index must be of integers, not %s (masks are tern.op.Compress)",
				             dtype_str(d));
				goto done;
			}
			if (d != TERN_INT64 && d != TERN_INT32) {
				int r = cast_var(iv, TERN_INT64, &adv);
				tern_var_unref(iv);
				if (r < 0)
					goto done;
			} else {
				adv = iv;
			}
			adv_axis = ax++;
			pos += tern_var_info(adv)->rank;
		} else if (PyIndex_Check(it)) {
			Py_ssize_t i = PyNumber_AsSsize_t(it, PyExc_IndexError), dim = (Py_ssize_t)t->dims[ax];
			if (i == -1 && PyErr_Occurred())
				goto done;
			if (i < -dim || i >= dim) {
				PyErr_Format(PyExc_IndexError, "index %zd is out of bounds for axis %d with size %zd",
				             i, ax, dim);
				goto done;
			}
			if (i < 0)
				i += dim;
			starts[n_slice] = i, ends[n_slice] = i + 1, steps[n_slice] = 1;
			axes[n_slice++] = ax;
			squeeze[n_squeeze++] = ax;
			ax++;
		} else {
			PyErr_Format(PyExc_IndexError,
			             "only integers, slices, None, Ellipsis and integer tensors or lists are valid "
			             "indices, not %s",
			             Py_TYPE(it)->tp_name);
			goto done;
		}
	}
	tern_ctx *ctx = tern_var_ctx(self->var);
	if (n_slice) {
		tern_var *in[5] = {cur, NULL, NULL, NULL, NULL}, *r = NULL;
		int ok = ints_var(ctx, starts, n_slice, &in[1]) == 0 && ints_var(ctx, ends, n_slice, &in[2]) == 0 &&
		        ints_var(ctx, axes, n_slice, &in[3]) == 0 && ints_var(ctx, steps, n_slice, &in[4]) == 0 &&
		        run1("Slice", in, 5, NULL, 0, &r) == 0;
		for (int i = 1; i < 5; i++)
			tern_var_unref(in[i]);
		if (!ok)
			goto done;
		tern_var_unref(cur);
		cur = r;
	}
	if (n_squeeze) {
		tern_var *in[2] = {cur, NULL}, *r = NULL;
		int ok = ints_var(ctx, squeeze, n_squeeze, &in[1]) == 0 && run1("Squeeze", in, 2, NULL, 0, &r) == 0;
		tern_var_unref(in[1]);
		if (!ok)
			goto done;
		tern_var_unref(cur);
		cur = r;
	}
	if (adv) {
		/* the axis counts after the squeezed ones are gone */
		int gaxis = adv_axis;
		for (int i = 0; i < n_squeeze; i++)
			gaxis -= squeeze[i] < adv_axis;
		tern_attr_arg a = {.name = "axis", .kind = TERN_ATTR_INT, .i = gaxis};
		tern_var *in[2] = {cur, adv}, *r = NULL;
		if (run1("Gather", in, 2, &a, 1, &r) < 0)
			goto done;
		tern_var_unref(cur);
		cur = r;
	}
	if (n_unsqueeze) {
		tern_var *in[2] = {cur, NULL}, *r = NULL;
		int ok = ints_var(ctx, unsqueeze, n_unsqueeze, &in[1]) == 0 &&
		        run1("Unsqueeze", in, 2, NULL, 0, &r) == 0;
		tern_var_unref(in[1]);
		if (!ok)
			goto done;
		tern_var_unref(cur);
		cur = r;
	}
	result = wrap(cur);
	cur = NULL;
done:
	tern_var_unref(cur);
	tern_var_unref(adv);
	Py_DECREF(items);
	return result;
}

static Py_ssize_t tensor_length(TensorObject *self)
{
	const tern_tensor *t = tern_var_info(self->var);
	if (t->rank == 0) {
		PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
		return -1;
	}
	return (Py_ssize_t)t->dims[0];
}

static int tensor_setitem(TensorObject *self, PyObject *key, PyObject *value)
{
	if (!value) {
		PyErr_SetString(PyExc_TypeError, "a tensor's elements cannot be deleted");
		return -1;
	}
	if (!g_setitem_hook) {
		PyErr_SetString(PyExc_TypeError, "item assignment needs the tern package (import tern)");
		return -1;
	}
	PyObject *r = PyObject_CallFunctionObjArgs(g_setitem_hook, (PyObject *)self, key, value, NULL);
	Py_XDECREF(r);
	return r ? 0 : -1;
}

static PyMappingMethods tensor_as_mapping = {
        .mp_length = (lenfunc)tensor_length,
        .mp_subscript = (binaryfunc)tensor_getitem,
        .mp_ass_subscript = (objobjargproc)tensor_setitem,
};

/* Iterates over the first axis (t[0], t[1], ...). */
static PyObject *tensor_iter(TensorObject *self)
{
	Py_ssize_t n = tensor_length(self);
	if (n < 0) {
		PyErr_SetString(PyExc_TypeError, "iteration over a 0-d tensor");
		return NULL;
	}
	PyObject *list = PyList_New(n);
	for (Py_ssize_t i = 0; list && i < n; i++) {
		PyObject *idx = PyLong_FromSsize_t(i), *item = idx ? tensor_getitem(self, idx) : NULL;
		Py_XDECREF(idx);
		if (!item) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, i, item);
	}
	if (!list)
		return NULL;
	PyObject *it = PyObject_GetIter(list);
	Py_DECREF(list);
	return it;
}

/* ---------------------------------------------------------------- Tensor: methods */

/* Axes from None (*n = -1), an int, or a sequence of ints. */
static int parse_axes(PyObject *o, int64_t *axes, int *n)
{
	*n = -1;
	if (!o || o == Py_None)
		return 0;
	if (PyIndex_Check(o)) {
		Py_ssize_t a = PyNumber_AsSsize_t(o, PyExc_OverflowError);
		if (a == -1 && PyErr_Occurred())
			return -1;
		axes[0] = a;
		*n = 1;
		return 0;
	}
	PyObject *seq = PySequence_Fast(o, "axes must be an int or a sequence of ints");
	if (!seq)
		return -1;
	Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
	if (len > TERN_MAX_RANK) {
		Py_DECREF(seq);
		PyErr_SetString(PyExc_ValueError, "too many axes");
		return -1;
	}
	for (Py_ssize_t i = 0; i < len; i++) {
		Py_ssize_t a = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i), PyExc_OverflowError);
		if (a == -1 && PyErr_Occurred()) {
			Py_DECREF(seq);
			return -1;
		}
		axes[i] = a;
	}
	*n = (int)len;
	Py_DECREF(seq);
	return 0;
}

/* A shape from f(2, 3) or f((2, 3)) or f([2, 3]). */
static int parse_shape(PyObject *args, int64_t *dims, int *rank, int allow_negative)
{
	PyObject *src = args;
	if (PyTuple_GET_SIZE(args) == 1 && !PyIndex_Check(PyTuple_GET_ITEM(args, 0)))
		src = PyTuple_GET_ITEM(args, 0);
	PyObject *seq = PySequence_Fast(src, "a shape is ints or a sequence of ints");
	if (!seq)
		return -1;
	Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
	if (len > TERN_MAX_RANK) {
		Py_DECREF(seq);
		PyErr_Format(PyExc_ValueError, "a shape of %zd dimensions (at most %d)", len, TERN_MAX_RANK);
		return -1;
	}
	for (Py_ssize_t i = 0; i < len; i++) {
		Py_ssize_t d = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i), PyExc_OverflowError);
		if (d == -1 && PyErr_Occurred()) {
			Py_DECREF(seq);
			return -1;
		}
		if (d < 0 && !(allow_negative && d == -1)) {
			Py_DECREF(seq);
			PyErr_Format(PyExc_ValueError, "negative dimension %zd in a shape", d);
			return -1;
		}
		dims[i] = d;
	}
	*rank = (int)len;
	Py_DECREF(seq);
	return 0;
}

/* sum, mean, max, min: axis (or torch's dim) None for all, keepdims (or keepdim). */
static PyObject *reduce(TensorObject *self, PyObject *args, PyObject *kwargs, const char *op)
{
	static char *kwlist[] = {"axis", "keepdims", "dim", "keepdim", NULL};
	PyObject *axis = Py_None, *dim = Py_None;
	int keepdims = 0, keepdim = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OpOp", kwlist, &axis, &keepdims, &dim, &keepdim))
		return NULL;
	int64_t axes[TERN_MAX_RANK];
	int n;
	if (parse_axes(axis != Py_None ? axis : dim, axes, &n) < 0)
		return NULL;
	tern_attr_arg a = {.name = "keepdims", .kind = TERN_ATTR_INT, .i = keepdims || keepdim};
	tern_var *in[2] = {self->var, NULL};
	if (n >= 0 && ints_var(tern_var_ctx(self->var), axes, n, &in[1]) < 0)
		return NULL;
	PyObject *r = run1_obj(op, in, n >= 0 ? 2 : 1, &a, 1);
	tern_var_unref(in[1]);
	return r;
}

static PyObject *tensor_sum(TensorObject *s, PyObject *a, PyObject *k)
{
	return reduce(s, a, k, "ReduceSum");
}
static PyObject *tensor_mean(TensorObject *s, PyObject *a, PyObject *k)
{
	return reduce(s, a, k, "ReduceMean");
}
static PyObject *tensor_max(TensorObject *s, PyObject *a, PyObject *k)
{
	return reduce(s, a, k, "ReduceMax");
}
static PyObject *tensor_min(TensorObject *s, PyObject *a, PyObject *k)
{
	return reduce(s, a, k, "ReduceMin");
}

/* argmax/argmin: axis None flattens first (numpy's rule). */
static PyObject *arg_reduce(TensorObject *self, PyObject *args, PyObject *kwargs, const char *op)
{
	static char *kwlist[] = {"axis", "keepdims", "dim", "keepdim", NULL};
	PyObject *axis = Py_None, *dim = Py_None;
	int keepdims = 0, keepdim = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OpOp", kwlist, &axis, &keepdims, &dim, &keepdim))
		return NULL;
	if (axis == Py_None)
		axis = dim;
	tern_var *x = tern_var_ref(self->var);
	int64_t ax = 0;
	if (axis == Py_None) {
		int64_t flat[1] = {-1};
		tern_var *in[2] = {x, NULL}, *r;
		int ok = ints_var(tern_var_ctx(x), flat, 1, &in[1]) == 0 && run1("Reshape", in, 2, NULL, 0, &r) == 0;
		tern_var_unref(in[1]);
		tern_var_unref(x);
		if (!ok)
			return NULL;
		x = r;
	} else {
		ax = PyLong_AsLongLong(axis);
		if (ax == -1 && PyErr_Occurred()) {
			tern_var_unref(x);
			return NULL;
		}
	}
	tern_attr_arg a[2] = {{.name = "axis", .kind = TERN_ATTR_INT, .i = ax},
	                      {.name = "keepdims", .kind = TERN_ATTR_INT, .i = keepdims || keepdim}};
	PyObject *r = run1_obj(op, &x, 1, a, 2);
	tern_var_unref(x);
	return r;
}

static PyObject *tensor_argmax(TensorObject *s, PyObject *a, PyObject *k)
{
	return arg_reduce(s, a, k, "ArgMax");
}
static PyObject *tensor_argmin(TensorObject *s, PyObject *a, PyObject *k)
{
	return arg_reduce(s, a, k, "ArgMin");
}

static PyObject *tensor_reshape(TensorObject *self, PyObject *args)
{
	int64_t dims[TERN_MAX_RANK];
	int rank;
	if (parse_shape(args, dims, &rank, 1) < 0)
		return NULL;
	tern_var *in[2] = {self->var, NULL};
	if (ints_var(tern_var_ctx(self->var), dims, rank, &in[1]) < 0)
		return NULL;
	PyObject *r = run1_obj("Reshape", in, 2, NULL, 0);
	tern_var_unref(in[1]);
	return r;
}

/* flatten(start_dim=0, end_dim=-1): the axes from start to end as one (torch's). */
static PyObject *tensor_flatten(TensorObject *self, PyObject *args, PyObject *kw)
{
	static char *names[] = {"start_dim", "end_dim", NULL};
	Py_ssize_t a = 0, b = -1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|nn:flatten", names, &a, &b))
		return NULL;
	const tern_tensor *t = tern_var_info(self->var);
	int rank = t->rank ? t->rank : 1;
	a = a < 0 ? a + rank : a;
	b = b < 0 ? b + rank : b;
	if (a < 0 || b >= rank || a > b) {
		PyErr_Format(PyExc_IndexError, "flatten: axes %zd..%zd of a tensor of %d dimensions", a, b, t->rank);
		return NULL;
	}
	int64_t dims[TERN_MAX_RANK];
	int n = 0;
	for (Py_ssize_t d = 0; d < a; d++)
		dims[n++] = t->dims[d];
	int64_t merged = 1;
	for (Py_ssize_t d = a; d <= b && t->rank; d++)
		merged *= t->dims[d];
	dims[n++] = merged;
	for (Py_ssize_t d = b + 1; d < t->rank; d++)
		dims[n++] = t->dims[d];
	tern_var *in[2] = {self->var, NULL};
	if (ints_var(tern_var_ctx(self->var), dims, n, &in[1]) < 0)
		return NULL;
	PyObject *r = run1_obj("Reshape", in, 2, NULL, 0);
	tern_var_unref(in[1]);
	return r;
}

/* clamp(min=None, max=None): Clip with numbers of the tensor's type (torch's clamp). */
static PyObject *tensor_clamp(TensorObject *self, PyObject *args, PyObject *kw)
{
	static char *names[] = {"min", "max", NULL};
	PyObject *lo = Py_None, *hi = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:clamp", names, &lo, &hi))
		return NULL;
	tern_ctx *c = tern_var_ctx(self->var);
	int dtype = tern_var_info(self->var)->dtype;
	tern_var *in[3] = {self->var, NULL, NULL};
	if ((lo != Py_None && scalar_var(c, dtype, lo, &in[1]) < 0) ||
	    (hi != Py_None && scalar_var(c, dtype, hi, &in[2]) < 0)) {
		tern_var_unref(in[1]);
		return NULL;
	}
	PyObject *r = run1_obj("Clip", in, 3, NULL, 0);
	tern_var_unref(in[1]);
	tern_var_unref(in[2]);
	return r;
}

static PyObject *transpose_perm(TensorObject *self, const int64_t *perm, int n)
{
	tern_attr_arg a = {.name = "perm", .kind = TERN_ATTR_INTS, .ints = perm, .n = (size_t)n};
	return run1_obj("Transpose", &self->var, 1, &a, n >= 0 ? 1 : 0);
}

/* transpose(): reversed; transpose(d0, d1): those two swapped (torch); transpose(perm) or
 * transpose(*perm) with every axis: numpy's permutation. */
static PyObject *tensor_transpose(TensorObject *self, PyObject *args)
{
	int rank = tern_var_info(self->var)->rank;
	Py_ssize_t n = PyTuple_GET_SIZE(args);
	if (n == 0)
		return transpose_perm(self, NULL, -1);
	int64_t perm[TERN_MAX_RANK];
	if (n == 2 && PyIndex_Check(PyTuple_GET_ITEM(args, 0)) && PyIndex_Check(PyTuple_GET_ITEM(args, 1))) {
		int64_t d[2];
		for (int k = 0; k < 2; k++) {
			Py_ssize_t v = PyNumber_AsSsize_t(PyTuple_GET_ITEM(args, k), PyExc_IndexError);
			if (v == -1 && PyErr_Occurred())
				return NULL;
			if (v < -rank || v >= rank) {
				PyErr_Format(PyExc_IndexError, "transpose: axis %zd of a tensor of %d dimensions", v,
				             rank);
				return NULL;
			}
			d[k] = v < 0 ? v + rank : v;
		}
		for (int i = 0; i < rank; i++)
			perm[i] = i;
		perm[d[0]] = d[1];
		perm[d[1]] = d[0];
		return transpose_perm(self, perm, rank);
	}
	int np;
	if (parse_axes(n == 1 ? PyTuple_GET_ITEM(args, 0) : args, perm, &np) < 0)
		return NULL;
	return transpose_perm(self, perm, np);
}

static PyObject *tensor_permute(TensorObject *self, PyObject *args)
{
	int64_t perm[TERN_MAX_RANK];
	int np;
	Py_ssize_t n = PyTuple_GET_SIZE(args);
	if (parse_axes(n == 1 ? PyTuple_GET_ITEM(args, 0) : args, perm, &np) < 0)
		return NULL;
	return transpose_perm(self, perm, np);
}

static PyObject *axes_op(TensorObject *self, PyObject *axis, const char *op)
{
	int64_t axes[TERN_MAX_RANK];
	int n;
	if (parse_axes(axis, axes, &n) < 0)
		return NULL;
	tern_var *in[2] = {self->var, NULL};
	if (n >= 0 && ints_var(tern_var_ctx(self->var), axes, n, &in[1]) < 0)
		return NULL;
	PyObject *r = run1_obj(op, in, n >= 0 ? 2 : 1, NULL, 0);
	tern_var_unref(in[1]);
	return r;
}

static PyObject *tensor_unsqueeze(TensorObject *self, PyObject *axis)
{
	return axes_op(self, axis, "Unsqueeze");
}

static PyObject *tensor_squeeze(TensorObject *self, PyObject *args)
{
	PyObject *axis = Py_None;
	if (!PyArg_ParseTuple(args, "|O:squeeze", &axis))
		return NULL;
	return axes_op(self, axis, "Squeeze");
}

static PyObject *softmax_like(TensorObject *self, PyObject *args, PyObject *kwargs, const char *op)
{
	static char *kwlist[] = {"axis", "dim", NULL};
	PyObject *axis = Py_None, *dim = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO", kwlist, &axis, &dim))
		return NULL;
	if (axis == Py_None)
		axis = dim;
	long long ax = -1;
	if (axis != Py_None && (ax = PyLong_AsLongLong(axis)) == -1 && PyErr_Occurred())
		return NULL;
	tern_attr_arg a = {.name = "axis", .kind = TERN_ATTR_INT, .i = ax};
	return run1_obj(op, &self->var, 1, &a, 1);
}

static PyObject *tensor_softmax(TensorObject *s, PyObject *a, PyObject *k)
{
	return softmax_like(s, a, k, "Softmax");
}
static PyObject *tensor_log_softmax(TensorObject *s, PyObject *a, PyObject *k)
{
	return softmax_like(s, a, k, "LogSoftmax");
}

#define UNARY_METHOD(name, op)                                               \
	static PyObject *tensor_##name(TensorObject *self, PyObject *unused) \
	{                                                                    \
		return unary(self, op);                                      \
	}
UNARY_METHOD(exp, "Exp")
UNARY_METHOD(log, "Log")
UNARY_METHOD(relu, "Relu")
UNARY_METHOD(sigmoid, "Sigmoid")
UNARY_METHOD(tanh, "Tanh")
UNARY_METHOD(sqrt, "Sqrt")
UNARY_METHOD(abs, "Abs")
UNARY_METHOD(neg, "Neg")
UNARY_METHOD(clone, "Identity")

static PyObject *cast_method(TensorObject *self, int dtype)
{
	tern_var *r;
	if (cast_var(self->var, dtype, &r) < 0)
		return NULL;
	return wrap(r);
}

static PyObject *tensor_float(TensorObject *self, PyObject *unused)
{
	return cast_method(self, TERN_FLOAT);
}
static PyObject *tensor_double(TensorObject *self, PyObject *unused)
{
	return cast_method(self, TERN_DOUBLE);
}
static PyObject *tensor_long(TensorObject *self, PyObject *unused)
{
	return cast_method(self, TERN_INT64);
}

static PyObject *tensor_astype(TensorObject *self, PyObject *dtype_obj)
{
	int dtype = TERN_UNDEFINED;
	if (parse_dtype(dtype_obj, &dtype) < 0)
		return NULL;
	if (dtype == TERN_UNDEFINED) {
		PyErr_SetString(PyExc_TypeError, "astype needs a dtype");
		return NULL;
	}
	return cast_method(self, dtype);
}

static PyObject *tensor_backward(TensorObject *self, PyObject *args, PyObject *kwargs)
{
	static char *kwlist[] = {"gradient", NULL};
	PyObject *gradient = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:backward", kwlist, &gradient))
		return NULL;
	tern_var *seed = NULL;
	if (gradient != Py_None && var_from_object(gradient, tern_var_info(self->var)->dtype, &seed) < 0)
		return NULL;
	tern_status rc = tern_backward(self->var, seed);
	tern_var_unref(seed);
	if (rc)
		return raise_status(rc);
	Py_RETURN_NONE;
}

static PyObject *tensor_requires_grad_(TensorObject *self, PyObject *args)
{
	int on = 1;
	if (!PyArg_ParseTuple(args, "|p:requires_grad_", &on))
		return NULL;
	tern_status rc = tern_var_set_requires_grad(self->var, on);
	if (rc)
		return raise_status(rc);
	return Py_NewRef(self);
}

static PyObject *tensor_numel(TensorObject *self, PyObject *unused)
{
	return PyLong_FromLongLong(tern_tensor_numel(tern_var_info(self->var)));
}

static PyObject *tensor_dim(TensorObject *self, PyObject *unused)
{
	return PyLong_FromLong(tern_var_info(self->var)->rank);
}

static PyObject *tensor_size(TensorObject *self, PyObject *args)
{
	PyObject *dim = Py_None;
	if (!PyArg_ParseTuple(args, "|O:size", &dim))
		return NULL;
	const tern_tensor *t = tern_var_info(self->var);
	if (dim == Py_None)
		return shape_tuple(t);
	Py_ssize_t d = PyNumber_AsSsize_t(dim, PyExc_IndexError);
	if (d == -1 && PyErr_Occurred())
		return NULL;
	if (d < -t->rank || d >= t->rank) {
		PyErr_Format(PyExc_IndexError, "size: dimension %zd of a tensor of %d dimensions", d, t->rank);
		return NULL;
	}
	return PyLong_FromLongLong(t->dims[d < 0 ? d + t->rank : d]);
}

/* Writes src's values (converted to the tensor's type; the same shape, or one element to fill)
 * into the tensor's own bytes: for initialisation and loading, not seen by autograd. */
/* self takes other's tensor (bytes and history): an in-place operation with a history, done as
 * the operation's result standing in for the tensor. */
static PyObject *tensor_assign_(TensorObject *self, PyObject *other)
{
	if (!Tensor_Check(other)) {
		PyErr_SetString(PyExc_TypeError, "_assign_ takes a Tensor");
		return NULL;
	}
	tern_var *old = self->var;
	self->var = tern_var_ref(((TensorObject *)other)->var);
	tern_var_unref(old);
	return Py_NewRef(self);
}

static PyObject *tensor_copy_(TensorObject *self, PyObject *src)
{
	const tern_tensor *t = tern_var_info(self->var);
	if (t->dtype == TERN_STRING) {
		PyErr_SetString(PyExc_TypeError, "copy_ into a string tensor");
		return NULL;
	}
	tern_var *v;
	if (Tensor_Check(src) && tern_var_info(VAR(src))->dtype == t->dtype)
		v = tern_var_ref(VAR(src)); /* read by the copy itself, in turn: no copy made here first */
	else if (var_from_object(src, t->dtype, &v) < 0)
		return NULL;
	const tern_tensor *s = tern_var_info(v);
	size_t isz = tern_dtype_size(t->dtype);
	int64_t n = tern_tensor_numel(t);
	if (s->rank == t->rank && !memcmp(s->dims, t->dims, (size_t)t->rank * sizeof *t->dims)) {
		/* before the bytes change; the value traced is src itself (v is a copy of it) */
		if (Tensor_Check(src) && tern_var_info(VAR(src))->dtype == t->dtype)
			tern_trace_assign(self->var, VAR(src));
		tern_status rc = tern_var_copy(self->var, v); /* in turn with the calls in flight, if any */
		if (rc) {
			tern_var_unref(v);
			return raise_status(rc);
		}
	} else if (tern_tensor_numel(s) == 1) {
		t = tern_var_tensor(self->var);
		s = tern_var_tensor(v);
		for (int64_t i = 0; i < n; i++)
			memcpy((char *)t->data + (size_t)i * isz, s->data, isz);
	} else {
		char a[160], b[160];
		PyErr_Format(PyExc_ValueError, "copy_: %s into %s",
		             tern_shape_str(s->dtype, s->rank, s->dims, a, sizeof a),
		             tern_shape_str(t->dtype, t->rank, t->dims, b, sizeof b));
		tern_var_unref(v);
		return NULL;
	}
	tern_var_unref(v);
	return Py_NewRef(self);
}

static PyObject *tensor_fill_(TensorObject *self, PyObject *value)
{
	return tensor_copy_(self, value);
}

static PyObject *tensor_zero_(TensorObject *self, PyObject *unused)
{
	const tern_tensor *t = tern_var_tensor(self->var);
	if (t->dtype == TERN_STRING) {
		PyErr_SetString(PyExc_TypeError, "zero_ of a string tensor");
		return NULL;
	}
	if (t->data)
		memset(t->data, 0, (size_t)tern_tensor_numel(t) * tern_dtype_size(t->dtype));
	return Py_NewRef(self);
}

static PyObject *tensor_matmul_method(TensorObject *self, PyObject *other)
{
	return nb_matmul((PyObject *)self, other);
}

static PyObject *tensor_pow_method(TensorObject *self, PyObject *other)
{
	return nb_pow((PyObject *)self, other, Py_None);
}

static PyObject *g_rebuild; /* tern._tern._rebuild, for pickling */

static PyObject *tensor_reduce_method(TensorObject *self, PyObject *unused)
{
	PyObject *arr = tensor_numpy(self, NULL);
	if (!arr)
		return NULL;
	PyObject *r = Py_BuildValue("O(NsOO)", g_rebuild, arr, dtype_str(tern_var_info(self->var)->dtype),
	                            tern_var_requires_grad(self->var) ? Py_True : Py_False,
	                            PyObject_TypeCheck(self, &ParameterType) ? Py_True : Py_False);
	return r;
}

static PyMethodDef tensor_methods[] = {
        {"numpy", (PyCFunction)tensor_numpy, METH_NOARGS,
         "numpy()\n--\n\nA numpy array holding a copy of the values (bfloat16 and float8 as float32)."},
        {"item", (PyCFunction)tensor_item, METH_NOARGS,
         "item()\n--\n\nThe value of a one-element tensor as a Python number."},
        {"tolist", (PyCFunction)tensor_tolist, METH_NOARGS, "tolist()\n--\n\nThe values as nested Python lists."},
        {"backward", (PyCFunction)(void (*)(void))tensor_backward, METH_VARARGS | METH_KEYWORDS,
         "backward(gradient=None)\n--\n\nAccumulates d(sum(self * gradient))/dx into x.grad for every leaf x that "
         "requires a "
         "gradient. Without gradient the tensor must have one element (a loss). The recorded operations below are "
         "released."},
        {"detach", (PyCFunction)tensor_detach, METH_NOARGS,
         "detach()\n--\n\nA tensor sharing these bytes, with no history and no gradient."},
        {"requires_grad_", (PyCFunction)tensor_requires_grad_, METH_VARARGS,
         "requires_grad_(requires_grad=True)\n--\n\nSets requires_grad on a leaf; returns the tensor."},
        {"sum", (PyCFunction)(void (*)(void))tensor_sum, METH_VARARGS | METH_KEYWORDS,
         "sum(axis=None, keepdims=False)\n--\n\nReduceSum over axis (an int or a tuple; None: all). dim and keepdim "
         "are "
         "accepted too."},
        {"mean", (PyCFunction)(void (*)(void))tensor_mean, METH_VARARGS | METH_KEYWORDS,
         "mean(axis=None, keepdims=False)\n--\n\nReduceMean over axis (None: all)."},
        {"max", (PyCFunction)(void (*)(void))tensor_max, METH_VARARGS | METH_KEYWORDS,
         "max(axis=None, keepdims=False)\n--\n\nReduceMax over axis (None: all)."},
        {"min", (PyCFunction)(void (*)(void))tensor_min, METH_VARARGS | METH_KEYWORDS,
         "min(axis=None, keepdims=False)\n--\n\nReduceMin over axis (None: all)."},
        {"argmax", (PyCFunction)(void (*)(void))tensor_argmax, METH_VARARGS | METH_KEYWORDS,
         "argmax(axis=None, keepdims=False)\n--\n\nArgMax along axis (None: of the flattened tensor), int64."},
        {"argmin", (PyCFunction)(void (*)(void))tensor_argmin, METH_VARARGS | METH_KEYWORDS,
         "argmin(axis=None, keepdims=False)\n--\n\nArgMin along axis (None: of the flattened tensor), int64."},
        {"flatten", (PyCFunction)(void (*)(void))tensor_flatten, METH_VARARGS | METH_KEYWORDS,
         "flatten(start_dim=0, end_dim=-1)\n--\n\nThe axes start_dim..end_dim as one (Reshape)."},
        {"clamp", (PyCFunction)(void (*)(void))tensor_clamp, METH_VARARGS | METH_KEYWORDS,
         "clamp(min=None, max=None)\n--\n\nValues limited to [min, max] (Clip)."},
        {"reshape", (PyCFunction)tensor_reshape, METH_VARARGS,
         "reshape(*shape)\n--\n\nReshape to shape (ints or one sequence; -1 once for the rest)."},
        {"view", (PyCFunction)tensor_reshape, METH_VARARGS, "view(*shape)\n--\n\nreshape(*shape)."},
        {"transpose", (PyCFunction)tensor_transpose, METH_VARARGS,
         "transpose(*axes)\n--\n\nTranspose: no axes reverses them; two ints swap those two (torch); otherwise a "
         "permutation "
         "of every axis (numpy)."},
        {"permute", (PyCFunction)tensor_permute, METH_VARARGS,
         "permute(*perm)\n--\n\nTranspose with the permutation perm."},
        {"unsqueeze", (PyCFunction)tensor_unsqueeze, METH_O,
         "unsqueeze(axis)\n--\n\nUnsqueeze: a dimension of 1 at axis (an int or a tuple)."},
        {"squeeze", (PyCFunction)tensor_squeeze, METH_VARARGS,
         "squeeze(axis=None)\n--\n\nSqueeze: removes dimensions of 1 (at axis, or all)."},
        {"exp", (PyCFunction)tensor_exp, METH_NOARGS, "exp()\n--\n\nExp."},
        {"log", (PyCFunction)tensor_log, METH_NOARGS, "log()\n--\n\nLog."},
        {"relu", (PyCFunction)tensor_relu, METH_NOARGS, "relu()\n--\n\nRelu."},
        {"sigmoid", (PyCFunction)tensor_sigmoid, METH_NOARGS, "sigmoid()\n--\n\nSigmoid."},
        {"tanh", (PyCFunction)tensor_tanh, METH_NOARGS, "tanh()\n--\n\nTanh."},
        {"sqrt", (PyCFunction)tensor_sqrt, METH_NOARGS, "sqrt()\n--\n\nSqrt."},
        {"abs", (PyCFunction)tensor_abs, METH_NOARGS, "abs()\n--\n\nAbs."},
        {"neg", (PyCFunction)tensor_neg, METH_NOARGS, "neg()\n--\n\nNeg."},
        {"clone", (PyCFunction)tensor_clone, METH_NOARGS, "clone()\n--\n\nA copy that autograd sees (Identity)."},
        {"softmax", (PyCFunction)(void (*)(void))tensor_softmax, METH_VARARGS | METH_KEYWORDS,
         "softmax(axis=-1)\n--\n\nSoftmax along axis."},
        {"log_softmax", (PyCFunction)(void (*)(void))tensor_log_softmax, METH_VARARGS | METH_KEYWORDS,
         "log_softmax(axis=-1)\n--\n\nLogSoftmax along axis."},
        {"float", (PyCFunction)tensor_float, METH_NOARGS, "float()\n--\n\nCast to float32."},
        {"double", (PyCFunction)tensor_double, METH_NOARGS, "double()\n--\n\nCast to float64."},
        {"long", (PyCFunction)tensor_long, METH_NOARGS, "long()\n--\n\nCast to int64."},
        {"astype", (PyCFunction)tensor_astype, METH_O,
         "astype(dtype)\n--\n\nCast to dtype (a name, numpy dtype or type)."},
        {"to", (PyCFunction)tensor_astype, METH_O, "to(dtype)\n--\n\nastype(dtype)."},
        {"numel", (PyCFunction)tensor_numel, METH_NOARGS, "numel()\n--\n\nThe number of elements."},
        {"dim", (PyCFunction)tensor_dim, METH_NOARGS, "dim()\n--\n\nThe number of dimensions."},
        {"size", (PyCFunction)tensor_size, METH_VARARGS,
         "size(dim=None)\n--\n\nThe shape, or the size of dimension dim."},
        {"matmul", (PyCFunction)tensor_matmul_method, METH_O, "matmul(other)\n--\n\nself @ other (MatMul)."},
        {"pow", (PyCFunction)tensor_pow_method, METH_O, "pow(exponent)\n--\n\nself ** exponent (Pow)."},
        {"_assign_", (PyCFunction)tensor_assign_, METH_O,
         "_assign_(other)\n--\n\nThe tensor takes other's values and history (an in-place operation's result)."},
        {"copy_", (PyCFunction)tensor_copy_, METH_O,
         "copy_(src)\n--\n\nWrites src (converted to this dtype; the same shape, or one element) into the tensor's "
         "bytes. "
         "Autograd does not see the write; returns the tensor."},
        {"fill_", (PyCFunction)tensor_fill_, METH_O,
         "fill_(value)\n--\n\nWrites value into every element; returns the tensor."},
        {"zero_", (PyCFunction)tensor_zero_, METH_NOARGS, "zero_()\n--\n\nWrites zeros into the tensor; returns it."},
        {"__reduce__", (PyCFunction)tensor_reduce_method, METH_NOARGS,
         "Pickling: the values, dtype and requires_grad."},
        {NULL},
};

/* clang-format off */
static PyTypeObject TensorType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tern.Tensor",
	.tp_basicsize = sizeof(TensorObject),
	.tp_dealloc = (destructor)tensor_dealloc,
	.tp_repr = (reprfunc)tensor_repr,
	.tp_as_number = &tensor_as_number,
	.tp_as_mapping = &tensor_as_mapping,
	.tp_hash = tensor_hash,
	.tp_as_buffer = &tensor_as_buffer,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "Tensor(data=None, dtype=None, requires_grad=False)\n--\n\n"
	          "A tensor of tern's eager mode: a reference-counted tern_var of the module's context. "
	          "Arithmetic (+ - * / @ ** %), comparisons and indexing run ONNX operators, recorded for "
	          "backward() when an input requires a gradient. data is converted as tern.tensor converts it.",
	.tp_richcompare = tensor_richcompare,
	.tp_weaklistoffset = offsetof(TensorObject, weakrefs),
	.tp_iter = (getiterfunc)tensor_iter,
	.tp_methods = tensor_methods,
	.tp_getset = tensor_getset,
	.tp_new = tensor_new,
};
/* clang-format on */

/* clang-format off */
static PyTypeObject ParameterType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tern.Parameter",
	.tp_basicsize = sizeof(TensorObject),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "Parameter(data=None, requires_grad=True, dtype=None)\n--\n\n"
	          "A Tensor that requires a gradient: what tern.nn modules hold and optimizers update. Data is float32 "
	          "(float64 arrays too) unless dtype says otherwise; Parameter(t) shares t's bytes as a new leaf.",
	.tp_new = parameter_new,
};
/* clang-format on */

/* ---------------------------------------------------------------- tern.op */

/* clang-format off */
typedef struct {
	PyObject_HEAD
	PyObject *name; /* str */
	PyObject *domain; /* str: "" for ONNX */
} OperatorObject;
/* clang-format on */

/* clang-format off */
typedef struct {
	PyObject_HEAD
	PyObject *domain;
} OpNamespaceObject;
/* clang-format on */

static void operator_dealloc(OperatorObject *self)
{
	Py_XDECREF(self->name);
	Py_XDECREF(self->domain);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *operator_make(PyObject *name, PyObject *domain)
{
	OperatorObject *op = PyObject_New(OperatorObject, &OperatorType);
	if (!op)
		return NULL;
	op->name = Py_NewRef(name);
	op->domain = Py_NewRef(domain);
	return (PyObject *)op;
}

static PyObject *operator_repr(OperatorObject *self)
{
	if (PyUnicode_GetLength(self->domain) > 0)
		return PyUnicode_FromFormat("<tern operator %U.%U>", self->domain, self->name);
	return PyUnicode_FromFormat("<tern operator %U>", self->name);
}

/* What a call needs freed afterwards: list storage, tensors made for TENSOR attributes and inputs. */
typedef struct {
	void **mem;
	tern_var **vars;
	int n_mem, n_vars, cap;
} call_scratch;

static int scratch_push(call_scratch *s, void *mem, tern_var *var)
{
	if (s->n_mem >= s->cap || s->n_vars >= s->cap) {
		int cap = s->cap ? 2 * s->cap : 16;
		void **m = PyMem_Realloc(s->mem, sizeof *m * (size_t)cap);
		if (m)
			s->mem = m;
		tern_var **v = m ? PyMem_Realloc(s->vars, sizeof *v * (size_t)cap) : NULL;
		if (v)
			s->vars = v;
		if (!m || !v) {
			PyMem_Free(mem);
			tern_var_unref(var);
			PyErr_NoMemory();
			return -1;
		}
		s->cap = cap;
	}
	if (mem)
		s->mem[s->n_mem++] = mem;
	if (var)
		s->vars[s->n_vars++] = var;
	return 0;
}

static void scratch_free(call_scratch *s)
{
	for (int i = 0; i < s->n_mem; i++)
		PyMem_Free(s->mem[i]);
	for (int i = 0; i < s->n_vars; i++)
		tern_var_unref(s->vars[i]);
	PyMem_Free(s->mem);
	PyMem_Free(s->vars);
}

/* One keyword argument as an ONNX attribute: int → INT, float → FLOAT, str or bytes → STRING, a
 * list or tuple of ints / floats / strings → INTS / FLOATS / STRINGS, a Tensor or array → TENSOR.
 * A dtype name given for an attribute named to or dtype is its ONNX type number (Cast(to='int64')).
 * keep holds the objects whose text the attribute points into. */
static int attr_from_object(const char *name, PyObject *v, tern_attr_arg *a, call_scratch *s, PyObject *keep)
{
	memset(a, 0, sizeof *a);
	a->name = name;
	int kind = number_kind(v);
	if (kind == NUM_BOOL || kind == NUM_INT) {
		PyObject *idx = PyNumber_Index(v);
		if (!idx)
			return -1;
		a->kind = TERN_ATTR_INT;
		a->i = PyLong_AsLongLong(idx);
		Py_DECREF(idx);
		return a->i == -1 && PyErr_Occurred() ? -1 : 0;
	}
	if (kind == NUM_FLOAT) {
		a->kind = TERN_ATTR_FLOAT;
		a->f = PyFloat_AsDouble(v);
		return a->f == -1.0 && PyErr_Occurred() ? -1 : 0;
	}
	if (PyUnicode_Check(v)) {
		const char *s8 = PyUnicode_AsUTF8(v);
		if (!s8)
			return -1;
		int d;
		if ((!strcmp(name, "to") || !strcmp(name, "dtype")) && (d = dtype_from_str(s8)) != TERN_UNDEFINED) {
			a->kind = TERN_ATTR_INT;
			a->i = d;
			return 0;
		}
		a->kind = TERN_ATTR_STRING;
		a->s = s8;
		return 0;
	}
	if (PyBytes_Check(v)) {
		a->kind = TERN_ATTR_STRING;
		a->s = PyBytes_AS_STRING(v);
		return 0;
	}
	if (Tensor_Check(v)) {
		a->kind = TERN_ATTR_TENSOR;
		a->t = tern_var_tensor(VAR(v));
		return 0;
	}
	if (PyList_Check(v) || PyTuple_Check(v)) {
		/* a tuple copy, so the strings stay while the call runs whatever the list does */
		PyObject *seq = PySequence_Tuple(v);
		if (!seq)
			return -1;
		int r = PyList_Append(keep, seq);
		Py_DECREF(seq);
		if (r < 0)
			return -1;
		Py_ssize_t n = PyTuple_GET_SIZE(seq);
		int all_int = 1, all_num = 1, all_str = 1;
		for (Py_ssize_t i = 0; i < n; i++) {
			PyObject *it = PyTuple_GET_ITEM(seq, i);
			int k = number_kind(it);
			all_int &= k == NUM_INT || k == NUM_BOOL;
			all_num &= k != NUM_NONE;
			all_str &= PyUnicode_Check(it) || PyBytes_Check(it);
		}
		void *mem = PyMem_Malloc((n ? (size_t)n : 1) * 8);
		if (!mem) {
			PyErr_NoMemory();
			return -1;
		}
		if (scratch_push(s, mem, NULL) < 0)
			return -1;
		a->n = (size_t)n;
		if (all_int) { /* an empty list is INTS: axes=[], pads=[] */
			int64_t *ints = mem;
			a->kind = TERN_ATTR_INTS;
			a->ints = ints;
			for (Py_ssize_t i = 0; i < n; i++) {
				PyObject *idx = PyNumber_Index(PyTuple_GET_ITEM(seq, i));
				if (!idx)
					return -1;
				ints[i] = PyLong_AsLongLong(idx);
				Py_DECREF(idx);
				if (ints[i] == -1 && PyErr_Occurred())
					return -1;
			}
			return 0;
		}
		if (all_num) {
			double *floats = mem;
			a->kind = TERN_ATTR_FLOATS;
			a->floats = floats;
			for (Py_ssize_t i = 0; i < n; i++)
				if ((floats[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(seq, i))) == -1.0 &&
				    PyErr_Occurred())
					return -1;
			return 0;
		}
		if (all_str) {
			const char **strs = mem;
			a->kind = TERN_ATTR_STRINGS;
			a->strings = strs;
			for (Py_ssize_t i = 0; i < n; i++) {
				PyObject *it = PyTuple_GET_ITEM(seq, i);
				strs[i] = PyUnicode_Check(it) ? PyUnicode_AsUTF8(it) : PyBytes_AS_STRING(it);
				if (!strs[i])
					return -1;
			}
			return 0;
		}
		PyErr_Format(PyExc_TypeError, "attribute '%s': a list must be all ints, all numbers or all strings",
		             name);
		return -1;
	}
	if (PyObject_CheckBuffer(v)) {
		tern_var *t;
		if (var_from_object(v, TERN_UNDEFINED, &t) < 0 || scratch_push(s, NULL, t) < 0)
			return -1;
		a->kind = TERN_ATTR_TENSOR;
		a->t = tern_var_tensor(t);
		return 0;
	}
	PyErr_Format(
	        PyExc_TypeError,
	        "attribute '%s': a %s is no ONNX attribute (int, float, str, bytes, a list of them, a tensor or an "
	        "array)",
	        name, Py_TYPE(v)->tp_name);
	return -1;
}

/* An operator input that is not a Tensor: a Python float takes the type of the first floating-point
 * tensor input (float32 when none), an int is int64, anything else converts as tern.tensor does. */
static int input_from_object(PyObject *o, int float_dtype, tern_var **out)
{
	int kind = number_kind(o);
	if (kind == NUM_FLOAT)
		return scalar_var(g_ctx, float_dtype, o, out);
	return var_from_object(o, TERN_UNDEFINED, out);
}

/* tern_call ignores attributes an operator does not read, so a misspelt one would pass silently,
 * and it hands missing required inputs to the operators' prepare functions, which expect a
 * validated graph: where a schema hook is set (tern/__init__.py sets one from onnx.defs when onnx
 * is installed), a call is checked against the operator's schema first, and ints given for float
 * attributes are converted. The hook returns None (no schema: no check) or a tuple
 * ({attribute: TERN_ATTR_* kind, 0: any}, min_inputs, max_inputs, (name of each input, None where
 * optional)), cached per operator. */
static PyObject *g_schema_hook, *g_schema_cache;
static long long g_opset; /* what set_opset set (0: the newest), for the hook */

static const char *attr_kind_str(int kind)
{
	switch (kind) {
	case TERN_ATTR_INT: return "an int";
	case TERN_ATTR_FLOAT: return "a float";
	case TERN_ATTR_STRING: return "a string";
	case TERN_ATTR_TENSOR: return "a tensor";
	case TERN_ATTR_INTS: return "a list of ints";
	case TERN_ATTR_FLOATS: return "a list of floats";
	case TERN_ATTR_STRINGS: return "a list of strings";
	default: return "something else";
	}
}

static int check_call(const char *domain, const char *op, tern_var *const *in, int n_in, tern_attr_arg *attrs, int n,
                      call_scratch *s)
{
	if (!g_schema_hook || !g_schema_cache)
		return 0;
	PyObject *key = Py_BuildValue("(ss)", domain, op);
	if (!key)
		return -1;
	PyObject *schema = PyDict_GetItemWithError(g_schema_cache, key); /* borrowed */
	if (!schema) {
		if (PyErr_Occurred() || !(schema = PyObject_CallFunction(g_schema_hook, "ssL", domain, op, g_opset))) {
			Py_DECREF(key);
			return -1;
		}
		int r = PyDict_SetItem(g_schema_cache, key, schema);
		Py_DECREF(schema); /* the cache holds it */
		if (r < 0) {
			Py_DECREF(key);
			return -1;
		}
	}
	Py_DECREF(key);
	PyObject *names = NULL;
	long min_in = 0, max_in = 0;
	if (schema == Py_None)
		return 0;
	if (!PyArg_ParseTuple(schema, "O!llO!;the schema hook returns (dict, int, int, tuple)", &PyDict_Type, &schema,
	                      &min_in, &max_in, &PyTuple_Type, &names))
		return -1;
	if (n_in < min_in || n_in > max_in) {
		PyErr_Format(g_usage_error, "%s: %d inputs given, %ld to %ld expected", op, n_in, min_in, max_in);
		return -1;
	}
	for (int i = 0; i < n_in && i < PyTuple_GET_SIZE(names); i++) {
		PyObject *name = PyTuple_GET_ITEM(names, i);
		if (!in[i] && name != Py_None) {
			PyErr_Format(g_usage_error, "%s: input %d (%S) is required, not None", op, i, name);
			return -1;
		}
	}
	for (int i = 0; i < n; i++) {
		tern_attr_arg *a = &attrs[i];
		PyObject *want_obj = PyDict_GetItemString(schema, a->name);
		if (!want_obj) {
			PyObject *names = PyDict_Keys(schema), *sep = names ? PyUnicode_FromString(", ") : NULL;
			if (names)
				PyList_Sort(names);
			PyObject *joined = sep ? PyUnicode_Join(sep, names) : NULL;
			if (joined)
				PyErr_Format(g_usage_error, "%s: unknown attribute '%s' (%s has %s%U)", op, a->name, op,
				             PyList_GET_SIZE(names) ? "" : "none", joined);
			Py_XDECREF(names);
			Py_XDECREF(sep);
			Py_XDECREF(joined);
			return -1;
		}
		long want = PyLong_AsLong(want_obj);
		if (want == -1 && PyErr_Occurred())
			return -1;
		if (want == 0 || want == a->kind)
			continue;
		if (want == TERN_ATTR_FLOAT && a->kind == TERN_ATTR_INT) {
			a->kind = TERN_ATTR_FLOAT;
			a->f = (double)a->i;
			continue;
		}
		if (a->kind == TERN_ATTR_INTS && a->n == 0 && (want == TERN_ATTR_FLOATS || want == TERN_ATTR_STRINGS)) {
			a->kind = (int)want;
			a->floats = (const double *)a->ints;
			a->strings = (const char *const *)a->ints;
			continue;
		}
		if (want == TERN_ATTR_FLOATS && a->kind == TERN_ATTR_INTS) {
			double *f = PyMem_Malloc(a->n * sizeof *f);
			if (!f) {
				PyErr_NoMemory();
				return -1;
			}
			if (scratch_push(s, f, NULL) < 0)
				return -1;
			for (size_t k = 0; k < a->n; k++)
				f[k] = (double)a->ints[k];
			a->kind = TERN_ATTR_FLOATS;
			a->floats = f;
			continue;
		}
		PyErr_Format(g_usage_error, "%s: attribute '%s' takes %s, not %s", op, a->name,
		             attr_kind_str((int)want), attr_kind_str(a->kind));
		return -1;
	}
	return 0;
}

static PyObject *operator_call(OperatorObject *self, PyObject *args, PyObject *kwargs)
{
	const char *op = PyUnicode_AsUTF8(self->name), *domain = PyUnicode_AsUTF8(self->domain);
	if (!op || !domain)
		return NULL;
	Py_ssize_t n_in = PyTuple_GET_SIZE(args);
	if (n_in > 64) {
		PyErr_Format(PyExc_ValueError, "%s: %zd inputs (at most 64)", op, n_in);
		return NULL;
	}
	call_scratch s = {0};
	PyObject *items = NULL, *keep = PyList_New(0), *result = NULL;
	tern_var *in[64] = {NULL}, **out = NULL;
	tern_attr_arg attrs[64];
	int n_attrs = 0, n_out = -1;
	if (!keep)
		return NULL;
	int float_dtype = TERN_FLOAT;
	for (Py_ssize_t i = 0; i < n_in; i++) {
		PyObject *a = PyTuple_GET_ITEM(args, i);
		if (Tensor_Check(a) && is_float(tern_var_info(VAR(a))->dtype)) {
			float_dtype = tern_var_info(VAR(a))->dtype;
			break;
		}
	}
	for (Py_ssize_t i = 0; i < n_in; i++) {
		PyObject *a = PyTuple_GET_ITEM(args, i);
		if (a == Py_None)
			continue;
		if (Tensor_Check(a))
			in[i] = tern_var_ref(VAR(a));
		else if (input_from_object(a, float_dtype, &in[i]) < 0)
			goto done;
	}
	if (kwargs && PyDict_GET_SIZE(kwargs)) {
		/* the items hold the keys and values while the call runs */
		if (!(items = PyDict_Items(kwargs)))
			goto done;
		Py_ssize_t n = PyList_GET_SIZE(items);
		for (Py_ssize_t k = 0; k < n; k++) {
			PyObject *kv = PyList_GET_ITEM(items, k), *key = PyTuple_GET_ITEM(kv, 0),
			         *val = PyTuple_GET_ITEM(kv, 1);
			const char *name = PyUnicode_AsUTF8(key);
			if (!name)
				goto done;
			if (!strcmp(name, "_outputs")) {
				long v = PyLong_AsLong(val);
				if (v == -1 && PyErr_Occurred())
					goto done;
				if (v < 1 || v > 64) {
					PyErr_Format(PyExc_ValueError, "%s: _outputs=%ld (1 to 64)", op, v);
					goto done;
				}
				n_out = (int)v;
				continue;
			}
			if (!strcmp(name, "_domain")) {
				if (!(domain = PyUnicode_AsUTF8(val)))
					goto done;
				continue;
			}
			if (n_attrs >= 64) {
				PyErr_Format(PyExc_ValueError, "%s: more than 64 attributes", op);
				goto done;
			}
			if (attr_from_object(name, val, &attrs[n_attrs], &s, keep) < 0)
				goto done;
			n_attrs++;
		}
	}
	if (check_call(domain, op, in, (int)n_in, attrs, n_attrs, &s) < 0)
		goto done;
	int asked = n_out;
	if (n_out < 0)
		n_out = tern_op_outputs(domain, op, attrs, n_attrs, in, (int)n_in);
	if (n_out < 1)
		n_out = 1; /* an unknown operator: tern_call says so */
	if (!(out = PyMem_Calloc((size_t)n_out, sizeof *out))) {
		PyErr_NoMemory();
		goto done;
	}
	tern_status rc = tern_call(ctx_of(in, (int)n_in), domain, op, in, (int)n_in, attrs, n_attrs, out, n_out);
	if (rc) {
		raise_status(rc);
		goto done;
	}
	if (n_out == 1 && asked <= 1) {
		result = out[0] ? wrap(out[0]) : Py_NewRef(Py_None);
		out[0] = NULL;
		goto done;
	}
	PyObject *tuple = PyTuple_New(n_out);
	if (!tuple)
		goto done;
	for (int o = 0; o < n_out; o++) {
		PyObject *item = out[o] ? wrap(out[o]) : Py_NewRef(Py_None);
		out[o] = NULL; /* wrap took it, or released it on failure */
		if (!item) {
			Py_DECREF(tuple);
			goto done;
		}
		PyTuple_SET_ITEM(tuple, o, item);
	}
	result = tuple;
done:
	for (Py_ssize_t i = 0; i < n_in; i++)
		tern_var_unref(in[i]);
	for (int o = 0; out && o < n_out; o++)
		tern_var_unref(out[o]);
	PyMem_Free(out);
	scratch_free(&s);
	Py_XDECREF(items);
	Py_DECREF(keep);
	return result;
}

static PyObject *operator_get_name(OperatorObject *self, void *closure)
{
	return Py_NewRef(self->name);
}

static PyObject *operator_get_domain(OperatorObject *self, void *closure)
{
	return Py_NewRef(self->domain);
}

static PyGetSetDef operator_getset[] = {
        {"__name__", (getter)operator_get_name, NULL, "The operator's name.", NULL},
        {"domain", (getter)operator_get_domain, NULL, "The operator's domain ('' for ONNX).", NULL},
        {NULL},
};

/* clang-format off */
static PyTypeObject OperatorType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tern._tern.Operator",
	.tp_basicsize = sizeof(OperatorObject),
	.tp_dealloc = (destructor)operator_dealloc,
	.tp_repr = (reprfunc)operator_repr,
	.tp_call = (ternaryfunc)operator_call,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "An operator of tern's registry: call it as op(*inputs, **attributes).\n\n"
	          "Inputs are Tensors, None for an omitted optional input, or numbers, lists and arrays "
	          "(converted). Attributes are ONNX attributes by keyword; _outputs=N asks for N outputs, "
	          "_domain='tern' picks tern's own operators. Returns a Tensor, or a tuple when the operator has "
	          "several outputs (None for one it left out).",
	.tp_getset = operator_getset,
};
/* clang-format on */

static void opns_dealloc(OpNamespaceObject *self)
{
	Py_XDECREF(self->domain);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *opns_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
	static char *kwlist[] = {"domain", NULL};
	PyObject *domain = NULL;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|U:OpNamespace", kwlist, &domain))
		return NULL;
	OpNamespaceObject *self = (OpNamespaceObject *)type->tp_alloc(type, 0);
	if (!self)
		return NULL;
	self->domain = domain ? Py_NewRef(domain) : PyUnicode_FromString("");
	if (!self->domain) {
		Py_DECREF(self);
		return NULL;
	}
	return (PyObject *)self;
}

/* Every name not starting with '_' is an operator; the others are the object's own, so
 * introspection (__class__, __doc__, _repr_...) works. */
static PyObject *opns_getattro(OpNamespaceObject *self, PyObject *name)
{
	if (!PyUnicode_Check(name) || PyUnicode_GetLength(name) == 0 || PyUnicode_READ_CHAR(name, 0) == '_')
		return PyObject_GenericGetAttr((PyObject *)self, name);
	return operator_make(name, self->domain);
}

static PyObject *opns_repr(OpNamespaceObject *self)
{
	return PyUnicode_FromFormat("<tern operators of domain '%U'>", self->domain);
}

/* clang-format off */
static PyTypeObject OpNamespaceType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tern._tern.OpNamespace",
	.tp_basicsize = sizeof(OpNamespaceObject),
	.tp_dealloc = (destructor)opns_dealloc,
	.tp_repr = (reprfunc)opns_repr,
	.tp_getattro = (getattrofunc)opns_getattro,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "OpNamespace(domain='')\n--\n\n"
	          "The operators of a domain as attributes: tern.op.Relu(x), tern.op.TopK(x, [2], axis=-1). "
	          "See Operator.",
	.tp_new = opns_new,
};
/* clang-format on */

/* ---------------------------------------------------------------- optimizers */

/* clang-format off */
typedef struct {
	PyObject_HEAD
	tern_optim *opt;
	PyObject *params; /* tuple of the Tensors it updates */
	PyObject *kind;
} OptimizerObject;
/* clang-format on */

static int optimizer_traverse(OptimizerObject *self, visitproc visit, void *arg)
{
	Py_VISIT(self->params);
	return 0;
}

static int optimizer_clear(OptimizerObject *self)
{
	Py_CLEAR(self->params);
	return 0;
}

static void optimizer_dealloc(OptimizerObject *self)
{
	PyObject_GC_UnTrack(self);
	tern_optim_free(self->opt);
	self->opt = NULL;
	optimizer_clear(self);
	Py_XDECREF(self->kind);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *optimizer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
	static char *kwlist[] = {"kind",         "params", "lr",  "momentum", "nesterov",
	                         "weight_decay", "betas",  "eps", "lr_decay", NULL};
	PyObject *kind, *params_obj, *betas = NULL;
	double lr, momentum = 0, weight_decay = -1, eps = -1, lr_decay = 0, beta1 = -1, beta2 = -1;
	int nesterov = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UOd|dpdOdd:Optimizer", kwlist, &kind, &params_obj, &lr,
	                                 &momentum, &nesterov, &weight_decay, &betas, &eps, &lr_decay))
		return NULL;
	if (betas && betas != Py_None) {
		PyObject *pair = PySequence_Check(betas) ? PySequence_Tuple(betas) : NULL;
		int ok = pair && PyArg_ParseTuple(pair, "dd;betas must be a pair of floats", &beta1, &beta2);
		Py_XDECREF(pair);
		if (!ok) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_TypeError, "betas must be a pair of floats");
			return NULL;
		}
	}
	const char *kind_s = PyUnicode_AsUTF8(kind);
	if (!kind_s)
		return NULL;
	PyObject *params = PySequence_Tuple(params_obj);
	if (!params)
		return NULL;
	Py_ssize_t n = PyTuple_GET_SIZE(params);
	tern_var **vars = PyMem_Calloc(n ? (size_t)n : 1, sizeof *vars);
	if (!vars) {
		Py_DECREF(params);
		return PyErr_NoMemory();
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *p = PyTuple_GET_ITEM(params, i);
		if (!Tensor_Check(p)) {
			PyErr_Format(PyExc_TypeError, "Optimizer: parameter %zd is a %s, not a Tensor", i,
			             Py_TYPE(p)->tp_name);
			PyMem_Free(vars);
			Py_DECREF(params);
			return NULL;
		}
		vars[i] = VAR(p);
	}
	tern_optim_options o = {.kind = kind_s,
	                        .lr = lr,
	                        .momentum = momentum,
	                        .nesterov = nesterov,
	                        .weight_decay = weight_decay,
	                        .beta1 = beta1,
	                        .beta2 = beta2,
	                        .eps = eps,
	                        .lr_decay = lr_decay};
	tern_optim *opt = NULL;
	tern_status rc = tern_optim_create(n ? tern_var_ctx(vars[0]) : g_ctx, &o, vars, (int)n, &opt);
	PyMem_Free(vars);
	if (rc) {
		Py_DECREF(params);
		return raise_status(rc);
	}
	OptimizerObject *self = (OptimizerObject *)type->tp_alloc(type, 0);
	if (!self) {
		tern_optim_free(opt);
		Py_DECREF(params);
		return NULL;
	}
	self->opt = opt;
	self->params = params;
	self->kind = Py_NewRef(kind);
	return (PyObject *)self;
}

static PyObject *optimizer_step(OptimizerObject *self, PyObject *unused)
{
	tern_status rc = tern_optim_step(self->opt);
	if (rc)
		return raise_status(rc);
	Py_RETURN_NONE;
}

static PyObject *optimizer_zero_grad(OptimizerObject *self, PyObject *unused)
{
	tern_optim_zero_grad(self->opt);
	Py_RETURN_NONE;
}

static PyObject *optimizer_get_lr(OptimizerObject *self, void *closure)
{
	return PyFloat_FromDouble(tern_optim_lr(self->opt));
}

static int optimizer_set_lr(OptimizerObject *self, PyObject *value, void *closure)
{
	if (!value) {
		PyErr_SetString(PyExc_AttributeError, "lr cannot be deleted");
		return -1;
	}
	double lr = PyFloat_AsDouble(value);
	if (lr == -1.0 && PyErr_Occurred())
		return -1;
	tern_optim_set_lr(self->opt, lr);
	return 0;
}

static PyObject *optimizer_get_steps(OptimizerObject *self, void *closure)
{
	return PyLong_FromLongLong(tern_optim_steps(self->opt));
}

static PyObject *optimizer_get_params(OptimizerObject *self, void *closure)
{
	return Py_NewRef(self->params);
}

static PyObject *optimizer_get_kind(OptimizerObject *self, void *closure)
{
	return Py_NewRef(self->kind);
}

static PyObject *optimizer_state(OptimizerObject *self, PyObject *args)
{
	int param, slot;
	if (!PyArg_ParseTuple(args, "ii:state", &param, &slot))
		return NULL;
	tern_var *v = tern_optim_state(self->opt, param, slot);
	if (!v) {
		PyErr_Format(PyExc_IndexError, "optimizer state (%d, %d): %d parameters, %d state tensors each", param, slot,
		             (int)PyTuple_GET_SIZE(self->params), tern_optim_num_state(self->opt));
		return NULL;
	}
	return wrap(tern_var_ref(v));
}

static PyObject *optimizer_param_steps(OptimizerObject *self, PyObject *args)
{
	int param;
	long long steps = -1;
	if (!PyArg_ParseTuple(args, "i|L:param_steps", &param, &steps))
		return NULL;
	if (steps >= 0 && tern_optim_set_param_steps(self->opt, param, steps))
		return raise_status(TERN_EUSAGE);
	int64_t n = tern_optim_param_steps(self->opt, param);
	if (n < 0) {
		PyErr_Format(PyExc_IndexError, "parameter %d of %d", param, (int)PyTuple_GET_SIZE(self->params));
		return NULL;
	}
	return PyLong_FromLongLong(n);
}

static PyObject *optimizer_get_num_state(OptimizerObject *self, void *closure)
{
	return PyLong_FromLong(tern_optim_num_state(self->opt));
}

static PyMethodDef optimizer_methods[] = {
        {"state", (PyCFunction)optimizer_state, METH_VARARGS,
         "state(param, slot)\n--\n\nState tensor slot of parameter param (its bytes are the optimizer's: copy_ "
         "writes them)."},
        {"param_steps", (PyCFunction)optimizer_param_steps, METH_VARARGS,
         "param_steps(param, steps=-1)\n--\n\nThe parameter's step count; steps >= 0 sets it first."},
        {"step", (PyCFunction)optimizer_step, METH_NOARGS,
         "step()\n--\n\nUpdates every parameter that has a gradient, in place (its bytes)."},
        {"zero_grad", (PyCFunction)optimizer_zero_grad, METH_NOARGS,
         "zero_grad()\n--\n\nClears the parameters' gradients."},
        {NULL},
};

static PyGetSetDef optimizer_getset[] = {
        {"lr", (getter)optimizer_get_lr, (setter)optimizer_set_lr, "The learning rate (read and write).", NULL},
        {"steps", (getter)optimizer_get_steps, NULL, "The steps taken.", NULL},
        {"params", (getter)optimizer_get_params, NULL, "The parameters, a tuple of Tensors.", NULL},
        {"kind", (getter)optimizer_get_kind, NULL, "'sgd', 'adam', 'adamw' or 'adagrad'.", NULL},
        {"num_state", (getter)optimizer_get_num_state, NULL, "State tensors per parameter.", NULL},
        {NULL},
};

/* clang-format off */
static PyTypeObject OptimizerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tern._tern.Optimizer",
	.tp_basicsize = sizeof(OptimizerObject),
	.tp_dealloc = (destructor)optimizer_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "Optimizer(kind, params, lr, momentum=0, nesterov=False, weight_decay=-1, betas=(-1, -1), eps=-1, "
	          "lr_decay=0)\n--\n\n"
	          "tern-autodiff's update rules (torch.optim's) on eager tensors: kind 'sgd', 'adam', 'adamw' or "
	          "'adagrad'; params float32 or float64 leaf Tensors; negative numbers take torch.optim's defaults. "
	          "tern.optim builds SGD, Adam, AdamW and Adagrad on it.",
	.tp_traverse = (traverseproc)optimizer_traverse,
	.tp_clear = (inquiry)optimizer_clear,
	.tp_methods = optimizer_methods,
	.tp_getset = optimizer_getset,
	.tp_new = optimizer_new,
};
/* clang-format on */

/* ---------------------------------------------------------------- module functions */

static PyObject *mod_tensor(PyObject *m, PyObject *args, PyObject *kwargs)
{
	static char *kwlist[] = {"data", "dtype", "requires_grad", NULL};
	PyObject *data, *dtype = Py_None;
	int requires_grad = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|Op:tensor", kwlist, &data, &dtype, &requires_grad))
		return NULL;
	return tensor_make(&TensorType, data, dtype, requires_grad, 0);
}

/* zeros/ones/full/randn/rand: the shape as ints or one sequence; keywords dtype and requires_grad. */
static int factory_args(PyObject *args, PyObject *kwargs, int64_t *dims, int *rank, int *dtype, int *requires_grad,
                        PyObject **fill)
{
	*dtype = TERN_FLOAT;
	*requires_grad = 0;
	PyObject *dt = NULL;
	if (kwargs) {
		PyObject *key, *value;
		Py_ssize_t pos = 0;
		while (PyDict_Next(kwargs, &pos, &key, &value)) {
			if (PyUnicode_CompareWithASCIIString(key, "dtype") == 0) {
				dt = value;
			} else if (PyUnicode_CompareWithASCIIString(key, "requires_grad") == 0) {
				if ((*requires_grad = PyObject_IsTrue(value)) < 0)
					return -1;
			} else if (fill && PyUnicode_CompareWithASCIIString(key, "fill_value") == 0) {
				*fill = value;
			} else {
				PyErr_Format(PyExc_TypeError, "unexpected keyword argument '%U'", key);
				return -1;
			}
		}
	}
	if (parse_dtype(dt, dtype) < 0)
		return -1;
	return parse_shape(args, dims, rank, 0);
}

static PyObject *finish_factory(tern_var *v, int requires_grad)
{
	if (requires_grad) {
		tern_status rc = tern_var_set_requires_grad(v, 1);
		if (rc) {
			tern_var_unref(v);
			return raise_status(rc);
		}
	}
	return wrap(v);
}

static PyObject *fill_tensor(int64_t *dims, int rank, int dtype, int requires_grad, PyObject *value)
{
	tern_var *v, *s = NULL;
	tern_status rc = tern_var_new(g_ctx, dtype, rank, dims, &v);
	if (rc)
		return raise_status(rc);
	if (value) {
		if (scalar_var(g_ctx, dtype, value, &s) < 0) {
			tern_var_unref(v);
			return NULL;
		}
		const tern_tensor *t = tern_var_tensor(v);
		size_t isz = tern_dtype_size(dtype);
		for (int64_t i = 0; i < tern_tensor_numel(t); i++)
			memcpy((char *)t->data + (size_t)i * isz, tern_var_tensor(s)->data, isz);
		tern_var_unref(s);
	}
	return finish_factory(v, requires_grad);
}

static PyObject *mod_zeros(PyObject *m, PyObject *args, PyObject *kwargs)
{
	int64_t dims[TERN_MAX_RANK];
	int rank, dtype, rg;
	if (factory_args(args, kwargs, dims, &rank, &dtype, &rg, NULL) < 0)
		return NULL;
	return fill_tensor(dims, rank, dtype, rg, NULL);
}

static PyObject *mod_ones(PyObject *m, PyObject *args, PyObject *kwargs)
{
	int64_t dims[TERN_MAX_RANK];
	int rank, dtype, rg;
	if (factory_args(args, kwargs, dims, &rank, &dtype, &rg, NULL) < 0)
		return NULL;
	PyObject *one = PyLong_FromLong(1);
	if (!one)
		return NULL;
	PyObject *r = fill_tensor(dims, rank, dtype, rg, one);
	Py_DECREF(one);
	return r;
}

static PyObject *mod_full(PyObject *m, PyObject *args, PyObject *kwargs)
{
	/* full(shape, fill_value, dtype=None): dtype from the value when not given, as torch */
	Py_ssize_t n = PyTuple_GET_SIZE(args);
	PyObject *fill = NULL;
	PyObject *shape_args = NULL;
	if (n == 2) {
		fill = PyTuple_GET_ITEM(args, 1);
		shape_args = PyTuple_GetSlice(args, 0, 1);
	} else {
		shape_args = Py_NewRef(args);
	}
	if (!shape_args)
		return NULL;
	int64_t dims[TERN_MAX_RANK];
	int rank, dtype, rg;
	int given = kwargs && PyDict_GetItemString(kwargs, "dtype") && PyDict_GetItemString(kwargs, "dtype") != Py_None;
	int r = factory_args(shape_args, kwargs, dims, &rank, &dtype, &rg, &fill);
	Py_DECREF(shape_args);
	if (r < 0)
		return NULL;
	if (!fill) {
		PyErr_SetString(PyExc_TypeError, "full(shape, fill_value): no fill_value");
		return NULL;
	}
	if (!given) {
		int kind = number_kind(fill);
		dtype = kind == NUM_BOOL ? TERN_BOOL : kind == NUM_INT ? TERN_INT64 : TERN_FLOAT;
	}
	return fill_tensor(dims, rank, dtype, rg, fill);
}

static PyObject *random_tensor(PyObject *args, PyObject *kwargs, const char *op)
{
	int64_t dims[TERN_MAX_RANK];
	int rank, dtype, rg;
	if (factory_args(args, kwargs, dims, &rank, &dtype, &rg, NULL) < 0)
		return NULL;
	tern_attr_arg a[2] = {{.name = "shape", .kind = TERN_ATTR_INTS, .ints = dims, .n = (size_t)rank},
	                      {.name = "dtype", .kind = TERN_ATTR_INT, .i = dtype}};
	tern_var *v;
	if (run1(op, NULL, 0, a, 2, &v) < 0)
		return NULL;
	return finish_factory(v, rg);
}

static PyObject *mod_randn(PyObject *m, PyObject *args, PyObject *kwargs)
{
	return random_tensor(args, kwargs, "RandomNormal");
}

static PyObject *mod_rand(PyObject *m, PyObject *args, PyObject *kwargs)
{
	return random_tensor(args, kwargs, "RandomUniform");
}

static PyObject *mod_manual_seed(PyObject *m, PyObject *arg)
{
	PyObject *idx = PyNumber_Index(arg);
	if (!idx)
		return NULL;
	/* any int: its low 64 bits (torch takes negative seeds too) */
	unsigned long long seed = PyLong_AsUnsignedLongLongMask(idx);
	Py_DECREF(idx);
	if (seed == (unsigned long long)-1 && PyErr_Occurred())
		return NULL;
	tern_ctx_manual_seed(g_ctx, seed);
	Py_RETURN_NONE;
}

static PyObject *mod_set_grad_enabled(PyObject *m, PyObject *arg)
{
	int on = PyObject_IsTrue(arg);
	if (on < 0)
		return NULL;
	return PyBool_FromLong(tern_ctx_set_grad_enabled(g_ctx, on));
}

static PyObject *mod_is_grad_enabled(PyObject *m, PyObject *unused)
{
	return PyBool_FromLong(tern_ctx_grad_enabled(g_ctx));
}

static PyObject *mod_set_opset(PyObject *m, PyObject *arg)
{
	long long v = PyLong_AsLongLong(arg);
	if (v == -1 && PyErr_Occurred())
		return NULL;
	tern_ctx_set_opset(g_ctx, v);
	g_opset = v > 0 ? v : 0;
	if (g_schema_cache)
		PyDict_Clear(g_schema_cache);
	Py_RETURN_NONE;
}

static PyObject *mod_cache_stats(PyObject *m, PyObject *unused)
{
	int64_t hits = 0, misses = 0;
	tern_ctx_cache_stats(g_ctx, &hits, &misses);
	return Py_BuildValue("LL", (long long)hits, (long long)misses);
}

static PyObject *mod_op_outputs(PyObject *m, PyObject *args, PyObject *kwargs)
{
	/* op_outputs(name, domain=''): the default output count, without inputs or attributes */
	static char *kwlist[] = {"name", "domain", NULL};
	const char *name, *domain = "";
	if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|s:op_outputs", kwlist, &name, &domain))
		return NULL;
	return PyLong_FromLong(tern_op_outputs(domain, name, NULL, 0, NULL, 0));
}

static int context_threads(void)
{
	const char *s = getenv("TERN_THREADS");
	int n = s ? atoi(s) : 1;
	return n > 0 ? n : 1;
}

static PyObject *mod_free_context_for_test(PyObject *m, PyObject *unused)
{
	/* closes the default context and opens a fresh one: tensors made before belong to the closed one */
	tern_ctx *c;
	tern_status rc = tern_ctx_create(context_threads(), &c);
	if (rc)
		return raise_status(rc);
	tern_ctx_free(g_ctx);
	g_ctx = c;
	Py_RETURN_NONE;
}

/* Tracing (tern-trace(1)): the call site is the Python stack outside the tern package, innermost
 * first, as file:line entries separated by ';'. */
static char *g_trace_pkg;
static size_t g_trace_pkg_len;

/* The stack's text, made once per distinct stack: calls from the same lines (a loop's body, every
 * step) find it again by a hash of the frames' code objects and instruction offsets, which costs a
 * few loads a frame, where the text costs a line-table lookup and a formatted file name a frame. */
#define SITE_CACHE 4096
static struct site_entry {
	uint64_t key;
	char *text;
} g_site_cache[SITE_CACHE];

static int frame_outside(PyCodeObject *code, const char **file)
{
	*file = code ? PyUnicode_AsUTF8(code->co_filename) : NULL;
	if (!*file) {
		PyErr_Clear();
		return 0;
	}
	return !g_trace_pkg || strncmp(*file, g_trace_pkg, g_trace_pkg_len) != 0;
}

static void site_text(char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = 0;
	PyFrameObject *f = PyEval_GetFrame();
	Py_XINCREF(f);
	while (f && n + 1 < size) {
		PyCodeObject *code = PyFrame_GetCode(f);
		const char *file;
		if (frame_outside(code, &file))
			n += (size_t)snprintf(buf + n, size - n, "%s%s:%d", n ? ";" : "", file, PyFrame_GetLineNumber(f));
		Py_XDECREF(code);
		PyFrameObject *back = PyFrame_GetBack(f);
		Py_DECREF(f);
		f = back;
	}
	Py_XDECREF(f);
	if (n >= size)
		buf[size - 1] = 0;
}

#if PY_VERSION_HEX >= 0x030B0000
/* The stack's key (stack_key.c). A code object lives as long as the functions made from it; the
 * module keeps tern's trace from outliving the program's. */
static uint64_t stack_key(void)
{
	return tern_py_stack_key();
}

static uint64_t trace_site_key(void *user)
{
	(void)user;
	return stack_key();
}
#endif

static int trace_site(void *user, char *buf, size_t size)
{
	(void)user;
#if PY_VERSION_HEX >= 0x030B0000
	uint64_t key = stack_key();
	struct site_entry *e = &g_site_cache[key % SITE_CACHE];
	if (e->text && e->key == key) {
		size_t n = strlen(e->text);
		n = n < size ? n : size - 1;
		memcpy(buf, e->text, n);
		buf[n] = 0;
		return 0;
	}
	site_text(buf, size);
	char *text = strdup(buf);
	if (text) {
		free(e->text);
		e->text = text;
		e->key = key;
	}
#else
	site_text(buf, size);
#endif
	return 0;
}

static PyObject *mod_trace_start(PyObject *m, PyObject *args)
{
	const char *path, *record = NULL, *pkg = NULL;
	int steps, verbose, replay = 0, coexec = 0;
	if (!PyArg_ParseTuple(args, "sizpz|pp:_trace_start", &path, &steps, &record, &verbose, &pkg, &replay, &coexec))
		return NULL;
	free(g_trace_pkg);
	g_trace_pkg = pkg ? strdup(pkg) : NULL;
	g_trace_pkg_len = pkg ? strlen(pkg) : 0;
	tern_trace_options o = {.path = path, .steps = steps, .site = trace_site,
#if PY_VERSION_HEX >= 0x030B0000
	                        .site_key = trace_site_key,
#endif
	                        .record_dir = record, .verbose = verbose,
	                        .replay = replay, .coexec = coexec};
	int rc = tern_trace_start(g_ctx, &o);
	if (rc)
		return raise_status(rc);
	Py_RETURN_NONE;
}

static PyObject *mod_trace_step(PyObject *m, PyObject *begin)
{
	int rc = PyObject_IsTrue(begin) ? tern_trace_step_begin(g_ctx) : tern_trace_step_end(g_ctx);
	if (rc)
		return raise_status(rc);
	Py_RETURN_NONE;
}

static PyObject *mod_trace_abandon(PyObject *m, PyObject *unused)
{
	tern_trace_step_abandon(g_ctx);
	Py_RETURN_NONE;
}

static PyObject *mod_trace_input(PyObject *m, PyObject *t)
{
	if (!Tensor_Check(t)) {
		PyErr_Format(PyExc_TypeError, "step_input: a Tensor, not %s", Py_TYPE(t)->tp_name);
		return NULL;
	}
	tern_trace_input(VAR(t));
	Py_RETURN_NONE;
}

static PyObject *mod_trace_finish(PyObject *m, PyObject *unused)
{
	int rc = tern_trace_finish(g_ctx);
	if (rc)
		return raise_status(rc);
	Py_RETURN_NONE;
}

static PyObject *mod_set_hooks(PyObject *m, PyObject *args)
{
	PyObject *set, *mask, *inpl;
	if (!PyArg_ParseTuple(args, "OOO:_set_hooks", &set, &mask, &inpl))
		return NULL;
	Py_XSETREF(g_setitem_hook, set == Py_None ? NULL : Py_NewRef(set));
	Py_XSETREF(g_mask_hook, mask == Py_None ? NULL : Py_NewRef(mask));
	Py_XSETREF(g_inplace_hook, inpl == Py_None ? NULL : Py_NewRef(inpl));
	Py_RETURN_NONE;
}

/* Methods written in Python (tern/_tensor.py) added to Tensor (and so Parameter). */
static PyObject *mod_add_tensor_methods(PyObject *m, PyObject *methods)
{
	if (!PyDict_Check(methods)) {
		PyErr_SetString(PyExc_TypeError, "_add_tensor_methods takes a dict");
		return NULL;
	}
	if (PyDict_Update(TensorType.tp_dict, methods) < 0)
		return NULL;
	PyType_Modified(&TensorType);
	Py_RETURN_NONE;
}

static PyObject *mod_set_attribute_schema(PyObject *m, PyObject *hook)
{
	if (hook != Py_None && !PyCallable_Check(hook)) {
		PyErr_SetString(PyExc_TypeError, "the attribute schema hook must be callable or None");
		return NULL;
	}
	Py_XSETREF(g_schema_hook, hook == Py_None ? NULL : Py_NewRef(hook));
	if (!g_schema_cache && !(g_schema_cache = PyDict_New()))
		return NULL;
	PyDict_Clear(g_schema_cache);
	Py_RETURN_NONE;
}

static PyObject *mod_rebuild(PyObject *m, PyObject *args)
{
	PyObject *arr, *dtype;
	int requires_grad, param;
	if (!PyArg_ParseTuple(args, "OOpp:_rebuild", &arr, &dtype, &requires_grad, &param))
		return NULL;
	return tensor_make(param ? &ParameterType : &TensorType, arr, dtype, requires_grad, param);
}

static PyMethodDef module_methods[] = {
        {"tensor", (PyCFunction)(void (*)(void))mod_tensor, METH_VARARGS | METH_KEYWORDS,
         "tensor(data, dtype=None, requires_grad=False)\n--\n\n"
         "A new tensor holding a copy of data: a numpy array or anything with the buffer protocol keeps its type; "
         "Python "
         "numbers and nested lists go through numpy.asarray, floats as float32 and ints as int64 (torch's defaults); a "
         "Tensor is copied without its history. dtype casts."},
        {"zeros", (PyCFunction)(void (*)(void))mod_zeros, METH_VARARGS | METH_KEYWORDS,
         "zeros(*shape, dtype='float32', requires_grad=False)\n--\n\nA tensor of zeros; shape as ints or one "
         "sequence."},
        {"ones", (PyCFunction)(void (*)(void))mod_ones, METH_VARARGS | METH_KEYWORDS,
         "ones(*shape, dtype='float32', requires_grad=False)\n--\n\nA tensor of ones."},
        {"full", (PyCFunction)(void (*)(void))mod_full, METH_VARARGS | METH_KEYWORDS,
         "full(shape, fill_value, dtype=None, requires_grad=False)\n--\n\nA tensor of fill_value (dtype from it when "
         "not "
         "given: float32, int64 or bool)."},
        {"randn", (PyCFunction)(void (*)(void))mod_randn, METH_VARARGS | METH_KEYWORDS,
         "randn(*shape, dtype='float32', requires_grad=False)\n--\n\nStandard normal samples (RandomNormal), from the "
         "stream manual_seed seeds."},
        {"rand", (PyCFunction)(void (*)(void))mod_rand, METH_VARARGS | METH_KEYWORDS,
         "rand(*shape, dtype='float32', requires_grad=False)\n--\n\nUniform samples in [0, 1) (RandomUniform)."},
        {"manual_seed", mod_manual_seed, METH_O,
         "manual_seed(seed)\n--\n\nSeeds the random operators of the default context (randn, rand, Dropout, ...)."},
        {"set_grad_enabled", mod_set_grad_enabled, METH_O,
         "set_grad_enabled(enabled)\n--\n\nTurns recording for autograd on or off; returns the previous setting."},
        {"is_grad_enabled", mod_is_grad_enabled, METH_NOARGS,
         "is_grad_enabled()\n--\n\nWhether operations are recorded for autograd."},
        {"set_opset", mod_set_opset, METH_O,
         "set_opset(opset)\n--\n\nThe ai.onnx opset operators are called at (0: the newest tern implements)."},
        {"cache_stats", mod_cache_stats, METH_NOARGS,
         "cache_stats()\n--\n\n(hits, misses): calls served from the cache of prepared calls, and calls that "
         "prepared."},
        {"op_outputs", (PyCFunction)(void (*)(void))mod_op_outputs, METH_VARARGS | METH_KEYWORDS,
         "op_outputs(name, domain='')\n--\n\nHow many outputs a call of the operator returns by default."},
        {"_free_context_for_test", mod_free_context_for_test, METH_NOARGS,
         "_free_context_for_test()\n--\n\nCloses the default context and opens a new one (tests: tensors of a freed "
         "context)."},
        {"_trace_start", mod_trace_start, METH_VARARGS,
         "_trace_start(path, steps, record_dir, verbose, package_dir, replay=False, coexec=False)\n--\n\nStarts tracing the default context."},
        {"_trace_step", mod_trace_step, METH_O, "_trace_step(begin)\n--\n\nA step begins (True) or ends (False)."},
        {"_trace_abandon", mod_trace_abandon, METH_NOARGS, "_trace_abandon()\n--\n\nThe step raised: left out."},
        {"_trace_input", mod_trace_input, METH_O,
         "_trace_input(tensor)\n--\n\nThe tensor is input data of the step (tern.step_input)."},
        {"_trace_finish", mod_trace_finish, METH_NOARGS,
         "_trace_finish()\n--\n\nWrites the trace if it is not written yet."},
        {"_set_hooks", mod_set_hooks, METH_VARARGS,
         "_set_hooks(setitem, mask_index, inplace)\n--\n\nThe Python functions behind t[k] = v, t[mask] and t += x."},
        {"_add_tensor_methods", mod_add_tensor_methods, METH_O,
         "_add_tensor_methods(dict)\n--\n\nAdds methods written in Python to Tensor."},
        {"_set_attribute_schema", mod_set_attribute_schema, METH_O,
         "_set_attribute_schema(hook)\n--\n\nhook(domain, op, opset) -> None or ({attribute: kind}, min_inputs, "
         "max_inputs, "
         "input names with None where optional): what tern.op checks calls against (hook None: no checks)."},
        {"_rebuild", mod_rebuild, METH_VARARGS, "Unpickling a Tensor or Parameter."},
        {NULL},
};

static void module_free(void *m)
{
	/* tensors still alive keep the closed context's memory until they go */
	tern_ctx_free(g_ctx);
	g_ctx = NULL;
}

static struct PyModuleDef module_def = {
        PyModuleDef_HEAD_INIT,
        .m_name = "tern._tern",
        .m_doc = "tern's eager mode: tensors, every registry operator by name, autograd and optimizers (tern_eager.h).",
        .m_size = -1,
        .m_methods = module_methods,
        .m_free = module_free,
};

static int add_type(PyObject *m, PyTypeObject *type, const char *name)
{
	if (PyType_Ready(type) < 0)
		return -1;
	Py_INCREF(type);
	if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
		Py_DECREF(type);
		return -1;
	}
	return 0;
}

static int add_exception(PyObject *m, PyObject **slot, const char *name, PyObject *bases, const char *doc)
{
	char full[64];
	snprintf(full, sizeof full, "tern.%s", name);
	*slot = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	if (!*slot)
		return -1;
	Py_INCREF(*slot);
	if (PyModule_AddObject(m, name, *slot) < 0) {
		Py_DECREF(*slot);
		return -1;
	}
	return 0;
}

PyMODINIT_FUNC PyInit__tern(void)
{
	if (g_ctx) {
		PyErr_SetString(PyExc_ImportError, "tern._tern is loaded once per process");
		return NULL;
	}
	PyObject *m = PyModule_Create(&module_def);
	if (!m)
		return NULL;
	tern_status rc = tern_ctx_create(context_threads(), &g_ctx);
	if (rc) {
		PyErr_Format(PyExc_ImportError, "tern: no context: %s", tern_error());
		g_ctx = NULL;
		goto fail;
	}
	ParameterType.tp_base = &TensorType;
	if (add_type(m, &TensorType, "Tensor") < 0 || add_type(m, &ParameterType, "Parameter") < 0 ||
	    add_type(m, &OperatorType, "Operator") < 0 || add_type(m, &OpNamespaceType, "OpNamespace") < 0 ||
	    add_type(m, &OptimizerType, "Optimizer") < 0)
		goto fail;
	/* numpy's binary operators defer to ours (ndarray + Tensor is Tensor.__radd__), and numpy.asarray
	 * still reads the tensor through the buffer protocol */
	if (PyDict_SetItemString(TensorType.tp_dict, "__array_ufunc__", Py_None) < 0)
		goto fail;
	PyType_Modified(&TensorType);

	g_error = PyErr_NewExceptionWithDoc("tern.Error", "A failed tern call; the message is tern_error()'s one line.",
	                                    PyExc_RuntimeError, NULL);
	if (!g_error || PyModule_AddObject(m, "Error", Py_NewRef(g_error)) < 0)
		goto fail;
	PyObject *usage_bases = PyTuple_Pack(3, g_error, PyExc_ValueError, PyExc_TypeError);
	PyObject *data_bases = PyTuple_Pack(2, g_error, PyExc_ValueError);
	int bad = !usage_bases || !data_bases ||
	        add_exception(m, &g_usage_error, "UsageError", usage_bases,
	                      "A bad call (TERN_EUSAGE): unknown operator or attribute, wrong shapes or types, a "
	                      "tensor of a freed context.") < 0 ||
	        add_exception(m, &g_data_error, "DataError", data_bases,
	                      "Bad tensor data or an unsupported operator (TERN_EDATA).") < 0;
	Py_XDECREF(usage_bases);
	Py_XDECREF(data_bases);
	if (bad)
		goto fail;

	PyObject *ns = PyObject_CallNoArgs((PyObject *)&OpNamespaceType);
	if (!ns || PyModule_AddObject(m, "op", ns) < 0) {
		Py_XDECREF(ns);
		goto fail;
	}
	g_rebuild = PyObject_GetAttrString(m, "_rebuild");
	if (!g_rebuild || PyModule_AddStringConstant(m, "__version__", TERN_VERSION) < 0)
		goto fail;
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
