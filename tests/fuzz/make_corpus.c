/* make_corpus.c - writes the fuzzers' seed corpus (tests/fuzz/corpus/<target>/) from the committed golden sets
 * and the tests' fixture writers. Built with the fuzzers (DSV4_FUZZ=ON); run from the source root:
 *   build-fuzz/make_corpus tests/fuzz/corpus
 * Seeds are small on purpose (a mutation should land in structure, not in tensor data):
 *   safetensors/  st_writer files (F32/BF16/F16/FP8+E8M0/FP4/I64, empty tensor), and the first small tensors of
 *                 st_writer's tiny model (official quantised, transformers names) and of each golden model
 *   config/       every golden config.json and the tests' tiny config
 *   index/        the index.json st_writer writes for a two-shard tiny model (the fuzzer's own folder)
 *   dump_raw/     synthetic dumps (synth_dump) and a trimmed copy of golden/tiny/forced.h5 (last 2 positions,
 *                 layers 0-2 and final), repacked contiguous (h5repack -L -l CONTI -f NONE) to stay small; and one
 *                 chunked + gzip dump as small as the writer makes it
 *   dump/         fuzz_dump's inputs describe a dump (any bytes are valid): a few fixed pseudo-random ones
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "model/internal.h"
#include "st_writer.h"
#include "synth_dump.h"

static const char *out_root;

static void die(const char *what)
{
    fprintf(stderr, "make_corpus: %s: %s\n", what, dsv4_last_error());
    exit(1);
}

static const char *path_of(const char *sub, const char *name)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", out_root, sub);
    mkdir(buf, 0755);
    snprintf(buf, sizeof buf, "%s/%s/%s", out_root, sub, name);
    return buf;
}

static void copy_file(const char *src, const char *dst)
{
    char *text;
    size_t len;
    if (dsv4_file_read_text(src, &text, &len)) die(src);
    FILE *f = fopen(dst, "wb");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f)) die(dst);
    free(text);
}

/* ------------------------------------------------------------------------------------- safetensors */
static void st_small_sets(void)
{
    dsv4_stw *w = dsv4_stw_new();
    float a[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, b[4] = {1, 2, 3, 4};
    uint16_t c[8] = {0x3f80, 0xbf80, 0x8000, 0x7f80, 0, 1, 2, 3};
    int64_t sa[2] = {3, 4}, sb[1] = {4}, sc[1] = {8}, s0[2] = {0, 4};
    dsv4_stw_add_f32(w, "layers.0.hc_attn_fn", 2, sa, a);
    dsv4_stw_add_f32(w, "layers.0.attn.attn_sink", 1, sb, b);
    dsv4_stw_add(w, "norm.weight", "BF16", 1, sc, c, sizeof c);
    if (dsv4_stw_write(w, path_of("safetensors", "small_f32_bf16.safetensors"), NULL)) die("small");
    dsv4_stw_add(w, "model.layers.0.input_layernorm.weight", "F16", 1, sc, c, sizeof c);
    dsv4_stw_add(w, "layers.1.attn.empty", "F32", 2, s0, NULL, 0);
    int64_t q[2] = {8, 8}, qs[2] = {1, 1}, e4[2] = {4, 4}, es[2] = {4, 1}, ti[2] = {4, 2};
    uint8_t fp8[64], sc8[1] = {127}, fp4[16], sc4[4] = {126, 127, 128, 129};
    int64_t tid[8] = {0, 1, 1, 2, 2, 3, 3, 0};
    for (int i = 0; i < 64; i++) fp8[i] = (uint8_t)(i * 37);
    for (int i = 0; i < 16; i++) fp4[i] = (uint8_t)(i * 0x11 + 3);
    dsv4_stw_add(w, "layers.0.attn.wkv.weight", "F8_E4M3", 2, q, fp8, sizeof fp8);
    dsv4_stw_add(w, "layers.0.attn.wkv.scale", "F8_E8M0", 2, qs, sc8, sizeof sc8);
    dsv4_stw_add(w, "layers.0.ffn.experts.0.w1.weight", "I8", 2, e4, fp4, sizeof fp4);
    dsv4_stw_add(w, "layers.0.ffn.experts.0.w1.scale", "F8_E8M0", 2, es, sc4, sizeof sc4);
    dsv4_stw_add(w, "layers.0.ffn.gate.tid2eid", "I64", 2, ti, tid, sizeof tid);
    if (dsv4_stw_write(w, path_of("safetensors", "every_dtype.safetensors"), NULL)) die("every dtype");
    dsv4_stw_free(w);
}

/* The first tensors (up to 16, each at most 2 KiB) of a model file, rewritten with their own bytes. */
static void st_subset(const char *src, const char *name)
{
    dsv4_st_file *f;
    if (dsv4_st_open(src, &f)) die(src);
    dsv4_stw *w = dsv4_stw_new();
    int kept = 0;
    for (int i = 0; i < f->n && kept < 16; i++) {
        const dsv4_st_entry *e = &f->entries[i];
        if (e->end - e->begin > 2048) continue;
        dsv4_stw_add(w, e->name, dsv4_dtype_name(e->dtype), e->ndim, e->shape, f->data + e->begin,
                     (size_t)(e->end - e->begin));
        kept++;
    }
    if (dsv4_stw_write(w, path_of("safetensors", name), NULL)) die(name);
    dsv4_stw_free(w);
    dsv4_st_free(f);
}

static void st_from_golden(const char *set)
{
    char src[512], name[128];
    snprintf(src, sizeof src, "golden/%s/model.safetensors", set);
    snprintf(name, sizeof name, "golden_%s.safetensors", set);
    st_subset(src, name);
}

/* The small tensors of st_writer's tiny model in the quantised official and the transformers namings. */
static void st_tiny_model(const char *tmp)
{
    static const dsv4_stw_naming namings[] = {DSV4_STW_OFFICIAL_QUANT, DSV4_STW_TRANSFORMERS_F32};
    static const char *const names[] = {"tiny_official_quant.safetensors", "tiny_transformers.safetensors"};
    for (int i = 0; i < 2; i++) {
        dsv4_stw_model_opts o = {namings[i], NULL, NULL, 1};
        if (dsv4_stw_make_model(tmp, dsv4_stw_tiny_config(), &o)) die("tiny model");
        char src[4200];
        snprintf(src, sizeof src, "%s/model.safetensors", tmp);
        st_subset(src, names[i]);
    }
}

/* ------------------------------------------------------------------------------------------ index */
static void index_seeds(const char *tmp)
{
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_F32, NULL, NULL, 2};
    if (dsv4_stw_make_model(tmp, dsv4_stw_tiny_config(), &o)) die("sharded model");
    char src[4200];
    snprintf(src, sizeof src, "%s/model.safetensors.index.json", tmp);
    copy_file(src, path_of("index", "two_shards.index.json"));
    FILE *f = fopen(path_of("index", "metadata_only.index.json"), "w");
    fputs("{\"metadata\": {\"total_size\": 0}, \"weight_map\": {}}\n", f);
    fclose(f);
}

/* ------------------------------------------------------------------------------------------- dump */
static void dump_synth(void)
{
    synth_spec s;
    synth_spec_init(&s);
    s.n_layers = 3;
    s.hidden = 8;
    s.head_dim = 8;
    s.index_head_dim = 8;
    s.index_topk = 2;
    s.n_experts = 4;
    s.k_experts = 2;
    s.vocab = 16;
    s.prompt_len = 6;
    s.n_decode = 3;
    if (synth_write(path_of("dump_raw", "synth_small.h5"), &s, 0)) die("synth");
    int32_t pos[3] = {1, 4, 8};
    s.positions = pos;
    s.n_positions = 3;
    s.mode = "greedy";
    if (synth_write(path_of("dump_raw", "synth_positions_greedy.h5"), &s, 0)) die("synth positions");
    s.positions = NULL;
    s.n_positions = 0;
    s.n_layers = 1;
    s.prompt_len = 2;
    s.n_decode = 0;
    if (synth_write(path_of("dump_raw", "synth_one_layer.h5"), &s, 0)) die("synth one layer");
}

/* A chunked, compressed dump as small as the writer makes one: the golden tiny config, 2 positions, 3 datasets. */
static void dump_minimal_chunked(void)
{
    dsv4_config cfg;
    char *cj;
    if (dsv4_file_read_text("golden/tiny/config.json", &cj, NULL) || dsv4_config_parse(cj, "golden", &cfg))
        die("golden config");
    int32_t tok[3] = {5, 7, 9}, pos[2] = {1, 2};
    dsv4_dump_meta meta = {"make_corpus", cj, "00", 2, 1, "forced"};
    dsv4_dump_writer *w;
    if (dsv4_dump_writer_open(path_of("dump_raw", "minimal_chunked.h5"), &meta, &cfg, tok, 3, pos, 2, &w)) die("writer");
    float row[256];
    for (int i = 0; i < 256; i++) row[i] = (float)i / 8 - 3;
    int64_t d[1] = {cfg.hidden_size}, v[1] = {cfg.vocab_size}, e[2] = {0, cfg.head_dim};
    for (int r = 0; r < 2; r++) {
        if (dsv4_dump_writer_row(w, "layers/0/attn_out", r, DSV4_DTYPE_F32, 1, d, row)) die("row");
        if (dsv4_dump_writer_row(w, "final/logits", r, DSV4_DTYPE_F32, 1, v, row)) die("row");
    }
    if (dsv4_dump_writer_array(w, "layers/1/compressed_kv", DSV4_DTYPE_F32, 2, e, row)) die("array");
    if (dsv4_dump_writer_commit(w)) die("commit");
    free(cj);
}

/* Rewrites a dump seed with contiguous, unfiltered datasets (h5repack, where installed): a quarter of the size. */
static void dump_repack(const char *name)
{
    char src[4096], cmd[8400];
    snprintf(src, sizeof src, "%s", path_of("dump_raw", name));
    snprintf(cmd, sizeof cmd, "h5repack -L -l CONTI -f NONE '%s' '%s.re' && mv '%s.re' '%s'", src, src, src, src);
    if (system(cmd) != 0) fprintf(stderr, "make_corpus: h5repack failed or missing; %s kept chunked\n", name);
}

/* golden/tiny/forced.h5 trimmed: its last two positions, layers 0-2 and final, every attribute kept. */
static void dump_from_golden(void)
{
    dsv4_dump *d;
    if (dsv4_dump_open("golden/tiny/forced.h5", &d)) die("golden dump");
    const dsv4_config *cfg;
    if (dsv4_dump_config(d, &cfg)) die("golden config");
    int nt, np;
    const int32_t *tok = dsv4_dump_tokens(d, &nt), *pos = dsv4_dump_positions(d, &np);
    dsv4_dump_meta meta = {dsv4_dump_attr(d, "producer"), dsv4_dump_attr(d, "config_json"),
                           dsv4_dump_attr(d, "weights_digest"), dsv4_dump_prompt_len(d), dsv4_dump_n_decode(d),
                           dsv4_dump_attr(d, "mode")};
    int keep = np < 2 ? np : 2, first = np - keep;
    dsv4_dump_writer *w;
    if (dsv4_dump_writer_open(path_of("dump_raw", "golden_tiny_trimmed.h5"), &meta, cfg, tok, nt, pos + first, keep, &w))
        die("writer");
    float *buf = malloc(1 << 22);
    for (int i = 0; i < dsv4_dump_dataset_count(d); i++) {
        const char *name = dsv4_dump_dataset_name(d, i);
        if (!strncmp(name, "layers/", 7) && atoi(name + 7) > 2) continue;
        dsv4_dataset_info in;
        if (dsv4_dump_info(d, name, &in)) die(name);
        size_t row = 1;
        for (int k = 1; k < in.ndim; k++) row *= (size_t)in.shape[k];
        int per_position = in.shape[0] == np && !strstr(name, "compressed_kv") && !strstr(name, "indexer_kv");
        if (per_position) {
            for (int r = 0; r < keep; r++) {
                if (dsv4_dump_read_rows(d, name, first + r, 1, buf)) die(name);
                if (dsv4_dump_writer_row(w, name, r, in.dtype, in.ndim - 1, in.shape + 1, buf)) die(name);
            }
        } else if ((size_t)in.shape[0] * row * 4 <= (1 << 22)) {
            if (dsv4_dump_read_rows(d, name, 0, in.shape[0], buf)) die(name);
            if (dsv4_dump_writer_array(w, name, in.dtype, in.ndim, in.shape, buf)) die(name);
        }
    }
    free(buf);
    if (dsv4_dump_writer_commit(w)) die("commit");
    dsv4_dump_free(d);
}

static void dump_fields_seeds(void)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    static const size_t lens[] = {48, 200, 900, 4000};
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "random_%zu.bin", lens[i]);
        FILE *f = fopen(path_of("dump", name), "wb");
        for (size_t k = 0; k < lens[i]; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            fputc((int)(x >> 56), f);
        }
        fclose(f);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus OUT_DIR   (run from the source root)\n");
        return 2;
    }
    out_root = argv[1];
    mkdir(out_root, 0755);
    char tmp1[] = "/tmp/dsv4-corpus-XXXXXX", tmp2[] = "/tmp/dsv4-corpus-XXXXXX";
    if (!mkdtemp(tmp1) || !mkdtemp(tmp2)) die("mkdtemp");
    st_small_sets();
    st_from_golden("tiny");
    st_from_golden("tiny-fp8");
    st_from_golden("topk512");
    st_tiny_model(tmp1);
    static const char *const sets[] = {"tiny", "tiny-fp8", "topk512"};
    for (int i = 0; i < 3; i++) {
        char src[256], dst[64];
        snprintf(src, sizeof src, "golden/%s/config.json", sets[i]);
        snprintf(dst, sizeof dst, "golden_%s.json", sets[i]);
        copy_file(src, path_of("config", dst));
    }
    FILE *f = fopen(path_of("config", "tests_tiny.json"), "w");
    fputs(dsv4_stw_tiny_config(), f);
    fclose(f);
    index_seeds(tmp2);
    dump_synth();
    dump_from_golden();
    dump_minimal_chunked();
    dump_fields_seeds();
    static const char *const repack[] = {"synth_small.h5", "synth_positions_greedy.h5", "synth_one_layer.h5",
                                         "golden_tiny_trimmed.h5"};
    for (int i = 0; i < 4; i++) dump_repack(repack[i]);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", tmp1, tmp2);
    return system(cmd) == 0 ? 0 : 1;
}
