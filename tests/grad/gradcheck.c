/* gradcheck — checks gradient rules against central finite differences.
 *
 *     gradcheck [--seed S] CASE|FOLDER...
 *
 * A CASE is a graph file (usually the text syntax, one operator) whose non-initializer inputs of a
 * floating-point type are the ones checked. With random inputs X and random output weights R, the
 * function f(X) = sum_j <Y_j(X), R_j> is differentiated by tern_autodiff (the rules under test)
 * and by central differences, element by element; they must agree within tolerances that follow the
 * element type (float64: eps 1e-6, |a - n| <= 1e-6 + 1e-4 |n|; float32: eps 1e-2, 2e-3 + 2e-2 |n|).
 * Each case is also checked for sensitivity: the analytic gradient scaled by 1 + max(0.01, 5 rtol)
 * must fail the same comparison somewhere, so that a case whose gradients are all near zero (or
 * whose tolerance is too loose) cannot pass by accident.
 *
 * A comment line in the case can set, for that case:
 *     # gradcheck: range=LO,HI   inputs drawn uniformly from [LO, HI) (default -1,1)
 *     # gradcheck: wrt=a,b       check only these inputs
 *     # gradcheck: rtol=R atol=A eps=E
 * Prints one line per case; exits 1 when one fails. */
#include "internal.h"

#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

struct settings {
	double lo, hi, rtol, atol, eps;
	char wrt[512];
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(double lo, double hi)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

static void read_settings(const char *path, int dtype, struct settings *s)
{
	bool f64 = dtype == TERN_DOUBLE;
	*s = (struct settings){-1, 1, f64 ? 1e-4 : 2e-2, f64 ? 1e-6 : 2e-3, f64 ? 1e-6 : 1e-2, ""};
	FILE *f = fopen(path, "r");
	char line[1024];
	while (f && fgets(line, sizeof line, f)) {
		const char *p = strstr(line, "# gradcheck:");
		if (!p)
			continue;
		for (char *tok = strtok((char *)p + 12, " \t\n"); tok; tok = strtok(NULL, " \t\n")) {
			if (sscanf(tok, "range=%lf,%lf", &s->lo, &s->hi) == 2 || sscanf(tok, "rtol=%lf", &s->rtol) == 1 ||
			    sscanf(tok, "atol=%lf", &s->atol) == 1 || sscanf(tok, "eps=%lf", &s->eps) == 1)
				continue;
			if (strncmp(tok, "wrt=", 4) == 0)
				snprintf(s->wrt, sizeof s->wrt, ",%s,", tok + 4);
		}
	}
	if (f)
		fclose(f);
}

static double get(const tern_tensor *t, int64_t i)
{
	return tern_tensor_get_f64(t, i);
}

static void set(tern_tensor *t, int64_t i, double v)
{
	if (t->dtype == TERN_DOUBLE)
		((double *)t->data)[i] = v;
	else
		((float *)t->data)[i] = (float)v;
}

/* f = sum_j <Y_j, R_j> over the plan's outputs that have weights */
static double objective(tern_plan *plan, const tern_tensor *inputs, int n_in, const tern_tensor *r, int n_r)
{
	if (tern_plan_run(plan, inputs, n_in) != TERN_OK)
		return NAN;
	double f = 0;
	for (int j = 0; j < n_r; j++) {
		const tern_tensor *y = tern_plan_output(plan, j);
		if (!r[j].data)
			continue;
		for (int64_t k = 0; k < tern_tensor_numel(y); k++)
			f += get(y, k) * get(&r[j], k);
	}
	return f;
}

static bool is_float(int dt)
{
	return dt == TERN_FLOAT || dt == TERN_DOUBLE;
}

static uint64_t base_seed = 0x9e3779b97f4a7c15ull;

/* One case; returns 0 pass, 1 fail, with a line on stdout. */
static int check_case(const char *path)
{
	/* each case draws from its own stream (seeded by its file name), so that adding a case does
	 * not change the inputs of the others */
	const char *base = strrchr(path, '/');
	rng_state = base_seed;
	for (const unsigned char *c = (const unsigned char *)(base ? base + 1 : path); *c; c++)
		rng_state = (rng_state ^ *c) * 0x100000001b3ull;
	rng_state |= 1;
	tern_model *fwd = NULL, *bwd = NULL;
	tern_plan *pf = NULL, *pb = NULL;
	tern_tensor in[32] = {{0}}, r[32] = {{0}}, all[64] = {{0}};
	int n_in = 0, n_out = 0, failed = 1;
	char why[512] = "";
	if (tern_model_load(path, &fwd) || tern_model_validate(fwd)) {
		snprintf(why, sizeof why, "%s", tern_error());
		goto done;
	}
	n_in = tern_model_num_inputs(fwd);
	if (n_in > 32) {
		snprintf(why, sizeof why, "too many inputs");
		goto done;
	}
	int first_dtype = 0;
	for (int i = 0; i < n_in; i++) {
		int dt, rank;
		int64_t dims[TERN_MAX_RANK];
		tern_model_input_type(fwd, i, &dt, &rank, dims, NULL);
		if (!first_dtype && is_float(dt))
			first_dtype = dt;
		if (rank < 0 || tern_tensor_alloc(&in[i], dt, rank, dims)) {
			snprintf(why, sizeof why, "input %d needs a static shape", i);
			goto done;
		}
	}
	struct settings s;
	read_settings(path, first_dtype, &s);
	for (int i = 0; i < n_in; i++)
		for (int64_t k = 0; is_float(in[i].dtype) && k < tern_tensor_numel(&in[i]); k++)
			set(&in[i], k, uniform(s.lo, s.hi));
	tern_plan_options po = {.n_threads = 1};
	if (tern_plan_create(fwd, &po, in, n_in, &pf) || tern_plan_run(pf, in, n_in)) {
		snprintf(why, sizeof why, "forward: %s", tern_error());
		goto done;
	}
	n_out = tern_plan_num_outputs(pf);
	for (int j = 0; j < n_out && j < 32; j++) {
		const tern_tensor *y = tern_plan_output(pf, j);
		if (!is_float(y->dtype))
			continue;
		tern_tensor_alloc(&r[j], y->dtype, y->rank, y->dims);
		for (int64_t k = 0; k < tern_tensor_numel(y); k++)
			set(&r[j], k, uniform(-1, 1));
	}

	/* the backward graph: a copy of the forward one, seeds as new inputs, gradients as new outputs */
	void *bytes;
	size_t size;
	if (tern_model_save_bytes(fwd, &bytes, &size) || tern_model_load_bytes(bytes, size, path, ".", &bwd)) {
		snprintf(why, sizeof why, "copy: %s", tern_error());
		goto done;
	}
	free(bytes);
	tern_graph *g = bwd->graph;
	tern_value *ys[32], *seeds[32], *wrt[32], *grads[32];
	int n_ys = 0, n_wrt = 0, wrt_index[32];
	for (int j = 0; j < n_out && j < 32; j++) {
		if (!r[j].data)
			continue;
		tern_type t;
		tern_type_unknown(&t);
		t.dtype = r[j].dtype;
		t.rank = r[j].rank;
		memcpy(t.dims, r[j].dims, sizeof t.dims);
		char name[64];
		snprintf(name, sizeof name, "gradcheck_seed_%d", j);
		ys[n_ys] = g->outputs[j];
		seeds[n_ys++] = tern_graph_add_input(g, name, &t);
	}
	for (int i = 0, k = 0; i < (int)g->n_inputs; i++) {
		tern_value *v = g->inputs[i];
		if (v->flags & TERN_VALUE_INITIALIZER || strncmp(v->name, "gradcheck_seed_", 15) == 0)
			continue;
		char key[300];
		snprintf(key, sizeof key, ",%s,", v->name);
		if (is_float(v->type.dtype) && (!s.wrt[0] || strstr(s.wrt, key))) {
			wrt_index[n_wrt] = k;
			wrt[n_wrt++] = v;
		}
		k++;
	}
	if (tern_autodiff(bwd, ys, seeds, n_ys, wrt, n_wrt, grads)) {
		snprintf(why, sizeof why, "autodiff: %s", tern_error());
		goto done;
	}
	/* two inputs may share one gradient value (Add of equal shapes): each reads its output's index */
	int grad_out[32];
	for (int i = 0; i < n_wrt; i++) {
		if (!grads[i] || tern_graph_add_output(g, grads[i])) {
			snprintf(why, sizeof why, "no gradient for '%s'", wrt[i]->name);
			goto done;
		}
		for (size_t o = 0; o < g->n_outputs; o++)
			if (g->outputs[o] == grads[i])
				grad_out[i] = (int)o;
	}
	int n_all = 0;
	for (int i = 0; i < n_in; i++)
		all[n_all++] = in[i];
	for (int j = 0; j < n_out && j < 32; j++)
		if (r[j].data)
			all[n_all++] = r[j];
	if (tern_plan_create(bwd, &po, all, n_all, &pb) || tern_plan_run(pb, all, n_all)) {
		snprintf(why, sizeof why, "backward: %s", tern_error());
		goto done;
	}
	/* analytic against numeric, and the same with the analytic scaled by 1.01 */
	double worst = 0;
	int checked = 0, sensitive = 0, fails = 0;
	/* a wrong gradient this far off must fail: 1 % in float64, more where float32 needs slack */
	double delta = fmax(0.01, 5 * s.rtol);
	for (int w = 0; w < n_wrt; w++) {
		tern_tensor *x = &in[wrt_index[w]];
		const tern_tensor *an = tern_plan_output(pb, grad_out[w]);
		if (an->rank != x->rank || tern_tensor_numel(an) != tern_tensor_numel(x)) {
			snprintf(why, sizeof why, "gradient of '%s' has the wrong shape", wrt[w]->name);
			goto done;
		}
		for (int64_t k = 0; k < tern_tensor_numel(x); k++) {
			double x0 = get(x, k);
			set(x, k, x0 + s.eps);
			double fp = objective(pf, in, n_in, r, n_out);
			set(x, k, x0 - s.eps);
			double fm = objective(pf, in, n_in, r, n_out);
			set(x, k, x0);
			double num = (fp - fm) / (2 * s.eps), a = get(an, k);
			double tol = s.atol + s.rtol * fabs(num);
			double err = fabs(a - num);
			checked++;
			if (!(err <= tol)) {
				if (!fails++)
					snprintf(why, sizeof why, "d/d%s[%lld]: rule %.9g, differences %.9g", wrt[w]->name,
					         (long long)k, a, num);
			}
			sensitive += !(fabs((1 + delta) * a - num) <= tol);
			if (tol > 0 && err / tol > worst)
				worst = err / tol;
		}
	}
	if (!fails && checked && !sensitive)
		snprintf(why, sizeof why, "insensitive: the gradient scaled by %.2f passes too (all near zero?)", 1 + delta);
	else if (!fails)
		failed = 0;
	printf("%s %s: %d elements, worst error %.2f of tolerance%s%s\n", failed ? "FAIL" : "ok  ", path, checked, worst,
	       why[0] ? "; " : "", why);
	fflush(stdout);
	goto cleanup;
done:
	printf("FAIL %s: %s\n", path, why);
cleanup:
	tern_plan_free(pf);
	tern_plan_free(pb);
	for (int i = 0; i < 32; i++) {
		tern_tensor_free(&in[i]);
		tern_tensor_free(&r[i]);
	}
	tern_model_free(fwd);
	tern_model_free(bwd);
	return failed;
}

int main(int argc, char **argv)
{
	int first = 1, failures = 0, n = 0;
	if (argc > 2 && strcmp(argv[1], "--seed") == 0) {
		base_seed ^= strtoull(argv[2], NULL, 10) * 0x2545f4914f6cdd1dull;
		first = 3;
	}
	if (first >= argc) {
		fprintf(stderr, "usage: gradcheck [--seed S] CASE...\n");
		return 64;
	}
	for (int i = first; i < argc; i++) {
		struct stat sb;
		if (stat(argv[i], &sb) == 0 && S_ISDIR(sb.st_mode)) {
			/* a folder: every *.txt case in it, in name order */
			char pattern[4096];
			snprintf(pattern, sizeof pattern, "%s/*.txt", argv[i]);
			glob_t gl;
			if (glob(pattern, 0, NULL, &gl) == 0) {
				for (size_t k = 0; k < gl.gl_pathc; k++, n++)
					failures += check_case(gl.gl_pathv[k]);
				globfree(&gl);
			}
			continue;
		}
		failures += check_case(argv[i]);
		n++;
	}
	printf("%d passed, %d failed\n", n - failures, failures);
	return failures ? 1 : 0;
}
