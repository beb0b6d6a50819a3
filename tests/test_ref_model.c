/* test_ref_model.c - the CPU reference as a whole on a small random model written here (F32 safetensors,
 * official names, every tensor dsv4_config_expected_tensors lists, fixed seed):
 * - the same prompt run as ONE prefill and as token-by-token decode from position 0 gives dumps that agree
 *   within 1e-5 on every probe (the state machine is exact): window wrap at sliding_window (40 tokens, window
 *   8), compressor windows closing at the step, CSA top-k smaller than the entries, HCA pools;
 * - a prefill of part of the prompt followed by decode agrees the same way;
 * - the decode step allocates nothing (the reference's counter and, outside sanitizer builds, malloc itself);
 * - capacity and call-order errors are reported, not crashed on.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/ref_model.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"

/* ------------------------------------------------------------------------------ malloc interposition */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TEST_COUNT_MALLOC 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static __thread int malloc_counting;
static __thread long malloc_calls;
void *malloc(size_t n)
{
    if (malloc_counting) malloc_calls++;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    if (malloc_counting) malloc_calls++;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    if (malloc_counting) malloc_calls++;
    return __libc_realloc(p, n);
}
#endif

/* ---------------------------------------------------------------------------------- random model */
static const char *test_config =
    "{\n"
    "  \"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\",\n"
    "  \"vocab_size\": 64, \"hidden_size\": 32, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 4,\n"
    "  \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 16, \"q_lora_rank\": 24,\n"
    "  \"partial_rotary_factor\": 0.5, \"num_experts_per_tok\": 2, \"n_routed_experts\": 4, \"n_shared_experts\": 1,\n"
    "  \"layer_types\": [\"sliding_attention\", \"compressed_sparse_attention\", \"heavily_compressed_attention\",\n"
    "                  \"compressed_sparse_attention\"],\n"
    "  \"mlp_layer_types\": [\"hash_moe\", \"hash_moe\", \"moe\", \"moe\"],\n"
    "  \"compress_rates\": {\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 8},\n"
    "  \"sliding_window\": 8, \"o_groups\": 2, \"o_lora_rank\": 8, \"index_n_heads\": 16, \"index_head_dim\": 16,\n"
    "  \"index_topk\": 3, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-06, \"rms_norm_eps\": 1e-06,\n"
    "  \"max_position_embeddings\": 4096, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,\n"
    "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16.0, \"original_max_position_embeddings\": 256,\n"
    "                   \"beta_fast\": 32, \"beta_slow\": 1},\n"
    "  \"swiglu_limit\": 1.0, \"routed_scaling_factor\": 1.5, \"scoring_func\": \"sqrtsoftplus\",\n"
    "  \"norm_topk_prob\": true, \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1\n"
    "}\n";

static uint64_t rng_state;
static double rng_uniform(void) /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Values by role: linears ~ U(±1/sqrt(in)), norm weights 1 ± 0.2, mHC fn small, biases/sinks/ape O(1). */
static void fill_tensor(const dsv4_expected_tensor *e, float *v, size_t numel)
{
    size_t in = e->ndim == 2 ? (size_t)e->shape[1] : 1;
    for (size_t i = 0; i < numel; i++) {
        double u = rng_uniform();
        if (strstr(e->name, "norm.weight") || ends_with(e->name, "norm.weight")) v[i] = (float)(1.0 + 0.2 * u);
        else if (strstr(e->name, "hc_") && ends_with(e->name, "_fn")) v[i] = (float)(0.1 * u);
        else if (ends_with(e->name, "_scale")) v[i] = (float)(1.0 + 0.5 * u);
        else if (ends_with(e->name, "_base")) v[i] = (float)(0.5 * u);
        else if (ends_with(e->name, "attn_sink")) v[i] = (float)(1.0 * u);
        else if (ends_with(e->name, ".ape")) v[i] = (float)(1.0 * u);
        else if (ends_with(e->name, "gate.bias")) v[i] = (float)(0.2 * u);
        else if (!strcmp(e->name, "embed.weight")) v[i] = (float)u;
        else v[i] = (float)(u / sqrt((double)in) * 1.7);
    }
}

/* Write dir/config.json and dir/model.safetensors (F32, tid2eid I64 with distinct ids per token). */
static void make_random_model(const char *dir, uint64_t seed)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert(f);
    fputs(test_config, f);
    fclose(f);
    dsv4_config cfg;
    ck_assert_int_eq(dsv4_config_parse(test_config, "test config", &cfg), 0);
    dsv4_expected_tensor *ex = NULL;
    int n = 0;
    ck_assert_int_eq(dsv4_config_expected_tensors(&cfg, &ex, &n), 0);
    rng_state = seed;
    size_t hcap = 1 << 20, hlen = 0, off = 0;
    char *hdr = malloc(hcap);
    size_t *nbytes = calloc((size_t)n, sizeof *nbytes);
    void **data = calloc((size_t)n, sizeof *data);
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "{");
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int k = 0; k < ex[i].ndim; k++) numel *= (size_t)ex[i].shape[k];
        int is_int = strstr(ex[i].name, "tid2eid") != NULL;
        nbytes[i] = numel * (is_int ? 8 : 4);
        data[i] = malloc(nbytes[i]);
        if (is_int) {
            int64_t *t = data[i];
            int64_t E = cfg.n_routed_experts, k = cfg.num_experts_per_tok;
            for (size_t r = 0; r < numel / (size_t)k; r++) {
                int64_t start = (int64_t)((rng_uniform() + 1.0) * 0.5 * (double)E) % E;
                for (int64_t j = 0; j < k; j++) t[r * (size_t)k + (size_t)j] = (start + j) % E;
            }
        } else {
            fill_tensor(&ex[i], data[i], numel);
        }
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                                 ex[i].name, is_int ? "I64" : "F32");
        for (int k = 0; k < ex[i].ndim; k++)
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "%s%lld", k ? "," : "", (long long)ex[i].shape[k]);
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "],\"data_offsets\":[%zu,%zu]}", off, off + nbytes[i]);
        off += nbytes[i];
        ck_assert(hlen < hcap - 256);
    }
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "}");
    while (hlen % 8) hdr[hlen++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    ck_assert(f);
    uint64_t hl = hlen;
    unsigned char le[8];
    for (int b = 0; b < 8; b++) le[b] = (unsigned char)(hl >> (8 * b));
    fwrite(le, 1, 8, f);
    fwrite(hdr, 1, hlen, f);
    for (int i = 0; i < n; i++) {
        fwrite(data[i], 1, nbytes[i], f);
        free(data[i]);
    }
    fclose(f);
    free(data);
    free(nbytes);
    free(hdr);
    free(ex);
}

/* ------------------------------------------------------------------------------------------ runs */
enum { T_TOKENS = 40 };

static void make_tokens(int32_t *t, int n, int vocab)
{
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 37 + 11 + (i * i) % 7) % vocab);
}

/* Run the model over tokens: positions < prefill_len in one prefill, the rest one by one; dump all. */
static void run_to_dump(dsv4_model *m, const int32_t *tokens, int n, int prefill_len, const char *path)
{
    const dsv4_config *cfg = dsv4_model_config(m);
    dsv4_ref *r = NULL;
    ck_assert_msg(dsv4_ref_cpu_init(m, n, &r) == 0, "init: %s", dsv4_last_error());
    dsv4_dump_meta meta = {.producer = dsv4_ref_producer(r), .config_json = dsv4_model_config_json(m),
                           .weights_digest = "0", .prompt_len = n, .n_decode = 0, .mode = "forced"};
    int32_t pos[T_TOKENS];
    for (int i = 0; i < n; i++) pos[i] = i;
    dsv4_dump_writer *w = NULL;
    dsv4_probe_sink *sink = NULL;
    ck_assert_msg(dsv4_dump_writer_open(path, &meta, cfg, tokens, n, pos, n, &w) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_probe_sink_init(w, cfg, pos, n, n, &sink) == 0, "%s", dsv4_last_error());
    float *logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    if (prefill_len > 0) ck_assert_msg(dsv4_ref_prefill(r, tokens, prefill_len, sink, logits) == 0, "%s", dsv4_last_error());
    for (int p = prefill_len; p < n; p++)
        ck_assert_msg(dsv4_ref_decode(r, tokens[p], sink, logits) == 0, "decode %d: %s", p, dsv4_last_error());
    ck_assert_int_eq(dsv4_ref_position(r), n);
    ck_assert_int_eq(dsv4_ref_dump_entries(r, sink), 0);
    dsv4_probe_sink_free(sink);
    ck_assert_msg(dsv4_dump_writer_commit(w) == 0, "%s", dsv4_last_error());
    free(logits);
    dsv4_ref_free(r);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Every dataset of a and b agrees: floats within tol relative to the dataset's max |a|, ids as row sets. */
static void compare_dumps(const char *pa, const char *pb, double tol)
{
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert_msg(dsv4_dump_open(pa, &a) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_dump_open(pb, &b) == 0, "%s", dsv4_last_error());
    int n = dsv4_dump_dataset_count(a);
    ck_assert_int_eq(n, dsv4_dump_dataset_count(b));
    ck_assert_int_gt(n, 60);
    for (int i = 0; i < n; i++) {
        const char *name = dsv4_dump_dataset_name(a, i);
        dsv4_dataset_info ia, ib;
        ck_assert_msg(dsv4_dump_has(b, name), "%s missing from %s", name, pb);
        ck_assert_int_eq(dsv4_dump_info(a, name, &ia), 0);
        ck_assert_int_eq(dsv4_dump_info(b, name, &ib), 0);
        ck_assert_int_eq(ia.ndim, ib.ndim);
        size_t numel = 1, row = 1;
        for (int k = 0; k < ia.ndim; k++) {
            ck_assert_msg(ia.shape[k] == ib.shape[k], "%s: dim %d %lld vs %lld", name, k, (long long)ia.shape[k],
                          (long long)ib.shape[k]);
            numel *= (size_t)ia.shape[k];
            if (k) row *= (size_t)ia.shape[k];
        }
        void *da = malloc(numel * 4 + 4), *db = malloc(numel * 4 + 4);
        ck_assert_int_eq(dsv4_dump_read_rows(a, name, 0, ia.shape[0], da), 0);
        ck_assert_int_eq(dsv4_dump_read_rows(b, name, 0, ib.shape[0], db), 0);
        if (ia.dtype == DSV4_DTYPE_I32) {
            int32_t *x = da, *y = db;
            for (size_t r0 = 0; r0 < numel; r0 += row) {
                qsort(x + r0, row, 4, cmp_i32);
                qsort(y + r0, row, 4, cmp_i32);
            }
            for (size_t k = 0; k < numel; k++)
                ck_assert_msg(x[k] == y[k], "%s: element %zu: %d vs %d", name, k, x[k], y[k]);
        } else {
            const float *x = da, *y = db;
            double mx = 0, worst = 0;
            size_t at = 0;
            for (size_t k = 0; k < numel; k++)
                if (isfinite(x[k])) mx = fmax(mx, fabs(x[k]));
            for (size_t k = 0; k < numel; k++) {
                ck_assert_msg(!isnan(x[k]) && !isnan(y[k]), "%s: NaN at %zu", name, k);
                if (isinf(x[k]) || isinf(y[k])) {
                    ck_assert_msg(x[k] == y[k], "%s: inf mismatch at %zu (%g vs %g)", name, k, x[k], y[k]);
                    continue;
                }
                double dlt = fabs((double)x[k] - y[k]);
                if (dlt > worst) worst = dlt, at = k;
            }
            ck_assert_msg(worst <= tol * fmax(mx, 1e-30), "%s: max |diff| %g at %zu (row %zu) exceeds %g x max %g",
                          name, worst, at, at / row, tol, mx);
        }
        free(da);
        free(db);
    }
    dsv4_dump_free(a);
    dsv4_dump_free(b);
}

static char *model_dir;
static dsv4_model *model;

static void setup_model(void)
{
    model_dir = dsv4_test_mkdtemp("ref-model");
    ck_assert(model_dir);
    make_random_model(model_dir, 20260501);
    ck_assert_msg(dsv4_model_open(model_dir, &model) == 0, "%s", dsv4_last_error());
}

static void teardown_model(void)
{
    dsv4_model_free(model);
    model = NULL;
    dsv4_test_rmtree(model_dir);
    model_dir = NULL;
}

START_TEST(test_prefill_equals_token_by_token)
{
    int32_t tok[T_TOKENS];
    make_tokens(tok, T_TOKENS, dsv4_model_config(model)->vocab_size);
    char pa[4200], pb[4200], pc[4200];
    snprintf(pa, sizeof pa, "%s/prefill.h5", model_dir);
    snprintf(pb, sizeof pb, "%s/decode.h5", model_dir);
    snprintf(pc, sizeof pc, "%s/mixed.h5", model_dir);
    run_to_dump(model, tok, T_TOKENS, T_TOKENS, pa); /* one prefill of 40 tokens (window 8 wraps 5 times) */
    run_to_dump(model, tok, T_TOKENS, 0, pb);        /* token by token from position 0 */
    run_to_dump(model, tok, T_TOKENS, 21, pc);       /* prefill 21 (a partial window left), then decode */
    compare_dumps(pa, pb, 1e-5);
    compare_dumps(pa, pc, 1e-5);
}
END_TEST

START_TEST(test_decode_allocates_nothing)
{
    const dsv4_config *cfg = dsv4_model_config(model);
    int32_t tok[T_TOKENS];
    make_tokens(tok, T_TOKENS, cfg->vocab_size);
    dsv4_ref *r = NULL;
    ck_assert_int_eq(dsv4_ref_cpu_init(model, T_TOKENS, &r), 0);
    float *logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    ck_assert_int_eq(dsv4_ref_prefill(r, tok, 5, NULL, logits), 0);
    ck_assert_int_eq(dsv4_ref_decode(r, tok[5], NULL, logits), 0); /* warm-up: OpenBLAS' own first-use set-up */
    long before = dsv4_ref_alloc_count();
#ifdef TEST_COUNT_MALLOC
    malloc_calls = 0;
    malloc_counting = 1;
#endif
    int rc = 0; /* no ck_assert inside the loop: Check itself allocates */
    for (int p = 6; p < T_TOKENS && !rc; p++) rc = dsv4_ref_decode(r, tok[p], NULL, logits);
#ifdef TEST_COUNT_MALLOC
    malloc_counting = 0;
#endif
    ck_assert_msg(rc == 0, "decode: %s", dsv4_last_error());
#ifdef TEST_COUNT_MALLOC
    ck_assert_msg(malloc_calls == 0, "decode steps called malloc %ld times", malloc_calls);
    /* the gate can fail: a malloc on this thread is seen */
    malloc_counting = 1;
    void *(*volatile mf)(size_t) = malloc; /* through a volatile pointer: a plain malloc+free pair is elided */
    void *probe = mf(16);
    malloc_counting = 0;
    free(probe);
    ck_assert_int_eq(malloc_calls, 1);
#endif
    ck_assert_msg(dsv4_ref_alloc_count() == before, "decode allocated %ld times", dsv4_ref_alloc_count() - before);
    /* a prefill (allowed to allocate its scratch) is seen by the counter */
    dsv4_ref *r2 = NULL;
    ck_assert_int_eq(dsv4_ref_cpu_init(model, T_TOKENS, &r2), 0);
    long b2 = dsv4_ref_alloc_count();
    ck_assert_int_eq(dsv4_ref_prefill(r2, tok, 8, NULL, logits), 0);
    ck_assert_int_gt(dsv4_ref_alloc_count(), b2);
    dsv4_ref_free(r2);
    free(logits);
    dsv4_ref_free(r);
}
END_TEST

START_TEST(test_capacity_and_order_errors)
{
    const dsv4_config *cfg = dsv4_model_config(model);
    int32_t tok[8];
    make_tokens(tok, 8, cfg->vocab_size);
    dsv4_ref *r = NULL;
    ck_assert_int_eq(dsv4_ref_cpu_init(model, 6, &r), 0);
    ck_assert_int_eq(dsv4_ref_prefill(r, tok, 7, NULL, NULL), DSV4_ERR_USAGE); /* past max_tokens */
    ck_assert_int_eq(dsv4_ref_prefill(r, tok, 4, NULL, NULL), 0);
    ck_assert_int_eq(dsv4_ref_prefill(r, tok, 1, NULL, NULL), DSV4_ERR_USAGE); /* prefill only first */
    ck_assert_int_eq(dsv4_ref_decode(r, 99999, NULL, NULL), DSV4_ERR_USAGE);   /* token outside vocab */
    ck_assert_int_eq(dsv4_ref_decode(r, tok[4], NULL, NULL), 0);
    ck_assert_int_eq(dsv4_ref_decode(r, tok[5], NULL, NULL), 0);
    ck_assert_int_eq(dsv4_ref_decode(r, tok[6], NULL, NULL), DSV4_ERR_USAGE);  /* past max_tokens */
    ck_assert_int_eq(dsv4_ref_position(r), 6);
    ck_assert_str_eq(dsv4_ref_producer(r), "dsv4 0.1 reference cpu fp32");
    dsv4_ref_free(r);
    dsv4_ref_free(NULL);
    ck_assert_int_eq(dsv4_ref_cpu_init(model, 0, &r), DSV4_ERR_USAGE);
    ck_assert_ptr_null(r);
}
END_TEST

static Suite *ref_model_suite(void)
{
    Suite *s = suite_create("ref_model");
    TCase *t = tcase_create("model");
    tcase_add_checked_fixture(t, setup_model, teardown_model);
    tcase_set_timeout(t, 600);
    tcase_add_test(t, test_prefill_equals_token_by_token);
    tcase_add_test(t, test_decode_allocates_nothing);
    tcase_add_test(t, test_capacity_and_order_errors);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return dsv4_test_main(ref_model_suite()); }
