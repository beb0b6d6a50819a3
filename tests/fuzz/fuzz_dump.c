/* fuzz_dump.c - libFuzzer target for the dump reader, structure-aware: the input DESCRIBES a dump.
 *
 * Raw HDF5 bytes mostly exercise libhdf5's own decoder (fuzz_dump_raw.c, and its findings are HDF5's). Here the
 * input bytes are decoded into what a dump from another tool could hold - each root attribute absent, a string
 * (variable or fixed length), an integer or a float; /tokens and /positions of any length, type, rank and values;
 * up to 12 datasets named like probes (or not), of any layer number, type, rank and shape, from empty to 2^40
 * declared rows, written or left unwritten; config_json from a small config with fuzzed sizes or raw bytes - and
 * written as a well-formed HDF5 file through the HDF5 API. The reader then opens it and reads everything as
 * dsv4 verify would (attributes, config, every dataset's info and first rows). The reader must refuse what is
 * wrong with a message; a crash, a leak, a hang or an allocation past DSV4_HOST_MEM_LIMIT (256M here) is a bug.
 * Seeds: tests/fuzz/corpus/dump/ (random bytes are valid inputs; the seeds are a few fixed ones).
 */
#define _POSIX_C_SOURCE 200809L
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "fuzz_dump_read.h"
#include "synth_dump.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_dump_init("dumpf");
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    return 0;
}

/* ------------------------------------------------------------------------------- input decoding */
typedef struct fuzz_in {
    const uint8_t *p;
    size_t n;
} fuzz_in;

static unsigned take8(fuzz_in *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static uint32_t take32(fuzz_in *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | take8(in);
    return v;
}

/* A dimension: mostly small, sometimes a few hundred, rarely huge (declared only: never written). */
static hsize_t take_dim(fuzz_in *in, int *huge)
{
    unsigned b = take8(in);
    if (b < 200) return b % 9;
    if (b < 244) return b;
    *huge = 1;
    return (hsize_t)1 << (b - 244 + 20); /* 2^20 .. 2^31 */
}

/* Up to max bytes of the input as a NUL-terminated string (malloc'd). */
static char *take_str(fuzz_in *in, size_t max)
{
    size_t len = take8(in);
    if (len == 255) len = take8(in) * 16u;
    if (len > max) len = max;
    if (len > in->n) len = in->n;
    char *s = malloc(len + 1);
    memcpy(s, in->p, len);
    s[len] = 0;
    in->p += len;
    in->n -= len;
    return s;
}

/* ------------------------------------------------------------------------------- writing the file */
static void put_str_attr(hid_t obj, const char *name, const char *value, int fixed)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (fixed) H5Tset_size(t, strlen(value) + 1);
    else H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) H5Awrite(a, t, fixed ? (const void *)value : (const void *)&value);
    if (a >= 0) H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

static void put_num_attr(hid_t obj, const char *name, hid_t ftype, double v)
{
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT);
    long long iv = (long long)v;
    if (a >= 0) {
        if (H5Tget_class(ftype) == H5T_FLOAT) H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
        else H5Awrite(a, H5T_NATIVE_LLONG, &iv);
        H5Aclose(a);
    }
    H5Sclose(s);
}

/* An attribute as the input chooses: 0 absent, 1 vlen string, 2 fixed string, 3 int64, 4 uint8, 5 float. */
static void put_attr(fuzz_in *in, hid_t file, const char *name, const char *normal)
{
    unsigned how = take8(in) % 8;
    if (how >= 6) how = 1; /* mostly the normal vlen string */
    char *s = NULL;
    if (how == 1 || how == 2) {
        if (take8(in) < 192) s = strdup(normal);
        else s = take_str(in, 4096);
        put_str_attr(file, name, s, how == 2);
    } else if (how == 3 || how == 4 || how == 5) {
        double v = (double)(int32_t)take32(in);
        put_num_attr(file, name, how == 3 ? H5T_STD_I64LE : how == 4 ? H5T_STD_U8LE : H5T_IEEE_F64LE, v);
    }
    free(s);
}

static const char *const probe_names[] = {
    "attn_hc_pre", "attn_hc_post", "attn_hc_comb", "attn_in", "kv", "compressed_kv", "indexer_kv", "indexer_scores",
    "topk_idx", "attn_out", "ffn_hc_pre", "ffn_hc_post", "ffn_hc_comb", "ffn_in", "router_ids", "router_weights",
    "ffn_out", "out", "hc_head", "norm", "logits", "extra_probe"};
#define N_PROBES (sizeof probe_names / sizeof probe_names[0])

/* A dataset: name, stored type, rank, dims, layout, data (from the input, or unwritten). */
static void put_dataset(fuzz_in *in, hid_t file, const char *fixed_name)
{
    char name[96];
    unsigned kind = take8(in);
    if (fixed_name) snprintf(name, sizeof name, "%s", fixed_name);
    else if (kind < 150) snprintf(name, sizeof name, "layers/%u/%s", take8(in) % 8, probe_names[take8(in) % N_PROBES]);
    else if (kind < 220) snprintf(name, sizeof name, "final/%s", probe_names[take8(in) % N_PROBES]);
    else if (kind < 235) snprintf(name, sizeof name, "layers/%u/%s", take32(in), probe_names[take8(in) % N_PROBES]);
    else if (kind < 245) snprintf(name, sizeof name, "layers/0%u/attn_out", take8(in) % 8);
    else snprintf(name, sizeof name, "layers/x%u/y/z", take8(in));
    hid_t type;
    switch (take8(in) % 8) { /* the native type ids are run-time values in HDF5: no static table */
    case 1: type = H5T_NATIVE_DOUBLE; break;
    case 2: case 7: type = H5T_NATIVE_INT32; break;
    case 3: type = H5T_NATIVE_INT64; break;
    case 4: type = H5T_NATIVE_UINT8; break;
    case 5: type = H5T_NATIVE_INT16; break;
    default: type = H5T_NATIVE_FLOAT; break;
    }
    int rank = (int)(take8(in) % 6), huge = 0; /* 0 = scalar, 5 = more than the reader takes */
    hsize_t dims[5] = {0}, maxd[5], chunk[5];
    double elems = 1;
    for (int i = 0; i < rank; i++) {
        dims[i] = take_dim(in, &huge);
        maxd[i] = dims[i];
        chunk[i] = dims[i] ? (dims[i] < 16 ? dims[i] : 16) : 1;
        elems *= (double)dims[i];
    }
    unsigned layout = take8(in);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    if (rank > 0 && (huge || layout & 1)) {
        if (layout & 2) maxd[0] = H5S_UNLIMITED;
        H5Pset_chunk(dcpl, rank, chunk);
        if (layout & 4) H5Pset_deflate(dcpl, 1);
    }
    hid_t space = rank ? H5Screate_simple(rank, dims, maxd) : H5Screate(H5S_SCALAR);
    hid_t d = H5Dcreate2(file, name, type, space, lcpl, dcpl, H5P_DEFAULT);
    size_t esz = H5Tget_size(type);
    if (d >= 0 && !huge && elems * esz <= (1 << 16) && elems > 0 && (layout & 8) == 0) {
        size_t nb = (size_t)elems * esz;
        uint8_t *buf = calloc(1, nb);
        size_t have = in->n < nb ? in->n : nb;
        memcpy(buf, in->p, have); /* raw input bytes: NaN, Inf, huge ints, negative ids */
        in->p += have;
        in->n -= have;
        H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
        free(buf);
    }
    if (d >= 0) H5Dclose(d);
    H5Sclose(space);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
}

/* config_json: a synthetic config with fuzzed sizes (mostly), or raw input bytes. */
static char *make_config(fuzz_in *in)
{
    if (take8(in) >= 224) return take_str(in, 8192);
    synth_spec s;
    synth_spec_init(&s);
    s.n_layers = 1 + (int)(take8(in) % 6);
    s.hidden = 1 + (int)(take8(in) % 16);
    s.head_dim = 2 * (1 + (int)(take8(in) % 8));
    s.index_head_dim = s.head_dim;
    s.index_topk = (int)(take8(in) % 8);
    s.n_experts = 1 + (int)(take8(in) % 8);
    s.k_experts = 1 + (int)(take8(in) % 4);
    s.vocab = (int)(take8(in) % 40);
    return synth_config_json(&s);
}

static int write_dump(fuzz_in *in)
{
    hid_t file = H5Fcreate(fuzz_path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) return -1;
    int prompt = (int)(take8(in) % 12), decode = (int)(take8(in) % 6);
    char *cfg = make_config(in);
    char pl[16], nd[16];
    snprintf(pl, sizeof pl, "%d", prompt);
    snprintf(nd, sizeof nd, "%d", decode);
    put_attr(in, file, "schema", DSV4_DUMP_SCHEMA);
    put_attr(in, file, "producer", "fuzz");
    put_attr(in, file, "config_json", cfg);
    put_attr(in, file, "weights_digest", "00ff");
    put_attr(in, file, "mode", take8(in) & 1 ? "forced" : "greedy");
    unsigned ints = take8(in);
    if (ints & 1) put_num_attr(file, "prompt_len", H5T_STD_I64LE, ints & 2 ? (double)(int32_t)take32(in) : prompt);
    if (ints & 4) put_num_attr(file, "n_decode", H5T_STD_I32LE, ints & 8 ? (double)(int32_t)take32(in) : decode);
    if (ints & 16) put_str_attr(file, "prompt_len", "7", 0);
    free(cfg);
    put_dataset(in, file, "tokens");
    put_dataset(in, file, "positions");
    unsigned nd_sets = take8(in) % 13;
    for (unsigned i = 0; i < nd_sets && in->n; i++) put_dataset(in, file, NULL);
    if (take8(in) == 7) { /* a group where a layer dataset is expected, a dataset where a group is */
        H5Gclose(H5Gcreate2(file, "final/logits_group", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    }
    return H5Fclose(file) < 0 ? -1 : 0;
}

/* ------------------------------------------------------------------------------------- reading */
/* The description written as a dump, then read as dsv4 verify would (fuzz_dump_read.h). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    if (write_dump(&in)) return 0;
    dsv4_dump *d;
    if (dsv4_dump_open(fuzz_path, &d) == 0) {
        fuzz_read_everything(d);
        dsv4_dump_free(d);
    }
    return 0;
}
