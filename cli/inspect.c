/* inspect.c - `dsv4 inspect MODEL_DIR`: summarise a model folder and check its tensors against its config.
 *
 * Prints the config (dims, the layer schedule as a compact grid, compress ratios, rope parameters,
 * quantisation), the tensor files, tensor count, bytes by on-disk dtype, the naming detected, and every
 * missing / unexpected / mis-shaped tensor (dsv4_model_check). Exit 0 = no problems, 1 = problems against
 * the config, 2 = bad usage or input that cannot be read (the error, naming file and tensor, on stderr).
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "dsv4/dsv4.h"
#include "progress.h"

static void print_help(FILE *f)
{
    fprintf(f,
            "usage: dsv4 inspect [--digest] MODEL_DIR\n\n"
            "Summarise a DeepSeek-V4 model folder (config.json + model.safetensors, or\n"
            "model.safetensors.index.json + shards) and check its tensors against the config.\n"
            "Accepts official checkpoint names, transformers module names and the save_pretrained layout.\n\n"
            "options:\n"
            "  --digest   also print weights_digest (SHA-256 of the weight files; reads every byte, with a\n"
            "             progress line on stderr when that takes more than a few seconds; a checkpoint of\n"
            "             1 GiB or more has it cached, keyed by each file's size and mtime, under\n"
            "             $XDG_CACHE_HOME/dsv4 or ~/.cache/dsv4: DSV4_DIGEST_CACHE=off hashes again)\n"
            "  --help     this text\n\n"
            "exit status:\n"
            "  0  the model matches its config\n"
            "  1  problems found: missing, unexpected, mis-shaped or mis-typed tensors, bad scales\n"
            "  2  bad usage, or input that cannot be read: config.json missing/invalid, a malformed\n"
            "     safetensors file or index (the error names the file and tensor)\n");
}

static void print_rope(const char *label, const dsv4_rope_params *r)
{
    printf("  rope %-9s theta %g", label, r->theta);
    if (r->yarn)
        printf(", yarn factor %g, original_max_position_embeddings %lld, beta_fast %g, beta_slow %g\n", r->factor,
               (long long)r->original_max_position_embeddings, r->beta_fast, r->beta_slow);
    else
        printf(", no scaling\n");
}

static void print_config(const dsv4_config *c)
{
    printf("config:\n");
    printf("  vocab %d, hidden %d, layers %d, heads %d x head_dim %d (rope dim %d), kv heads %d\n", c->vocab_size,
           c->hidden_size, c->num_hidden_layers, c->num_attention_heads, c->head_dim, c->qk_rope_head_dim,
           c->num_key_value_heads);
    printf("  q_lora_rank %d, o_groups %d x o_lora_rank %d, sliding_window %d\n", c->q_lora_rank, c->o_groups,
           c->o_lora_rank, c->sliding_window);
    printf("  indexer %d heads x %d, top-k %d\n", c->index_n_heads, c->index_head_dim, c->index_topk);
    printf("  experts %d routed + %d shared, top-%d, intermediate %d, %s, norm_topk_prob %s, scaling %g, "
           "swiglu_limit %g\n",
           c->n_routed_experts, c->n_shared_experts, c->num_experts_per_tok, c->moe_intermediate_size,
           c->scoring_func, c->norm_topk_prob ? "true" : "false", c->routed_scaling_factor, c->swiglu_limit);
    printf("  mHC %d streams, %d Sinkhorn iterations, hc_eps %g, rms_norm_eps %g\n", c->hc_mult,
           c->hc_sinkhorn_iters, c->hc_eps, c->rms_norm_eps);
    printf("  max_position_embeddings %lld, tie_word_embeddings %s, bos %d, eos %d\n",
           (long long)c->max_position_embeddings, c->tie_word_embeddings ? "true" : "false", c->bos_token_id,
           c->eos_token_id);
    printf("  compress ratios: csa %d, hca %d\n", c->compress_rate_csa, c->compress_rate_hca);
    print_rope("main", &c->rope_main);
    print_rope("compress", &c->rope_compress);
    printf("  quantisation: %s; expert dtype %s\n", c->fp8_block_quant ? "fp8 e4m3, 128x128 block scales" : "none",
           c->expert_dtype[0] ? c->expert_dtype : "(not set)");
    int n[3] = {0, 0, 0};
    for (int i = 0; i < c->num_hidden_layers; i++) n[c->attn_type[i]]++;
    printf("layers: %d sliding, %d csa, %d hca; %d hash_moe, %d moe\n", n[0], n[1], n[2], c->num_hash_layers,
           c->num_hidden_layers - c->num_hash_layers);
    printf("  attention: S = sliding, C = csa (ratio %d), H = hca (ratio %d); mlp: h = hash_moe, m = moe\n",
           c->compress_rate_csa, c->compress_rate_hca);
    static const char attn_letter[] = {'S', 'C', 'H'};
    for (int i = 0; i < c->num_hidden_layers; i += 10) {
        int last = i + 9 < c->num_hidden_layers - 1 ? i + 9 : c->num_hidden_layers - 1;
        char label[32];
        snprintf(label, sizeof label, "%d-%d", i, last);
        printf("  %-8s", label);
        for (int j = i; j <= last; j++)
            printf(" %c%c", attn_letter[c->attn_type[j]], c->mlp_type[j] == DSV4_MLP_HASH_MOE ? 'h' : 'm');
        printf("\n");
    }
}

static void print_tensors(const dsv4_model *m)
{
    int n = dsv4_model_tensor_count(m), on_disk = 0, views = 0;
    size_t bytes[DSV4_DTYPE_COUNT] = {0}, count[DSV4_DTYPE_COUNT] = {0};
    const dsv4_tensor *embed = NULL, *prev = NULL;
    dsv4_model_tensor(m, "embed.weight", &embed);
    for (int i = 0; i < n; i++) {
        const dsv4_tensor *t = dsv4_model_tensor_at(m, i);
        int alias = embed && t != embed && t->data == embed->data; /* tied head */
        int view = prev && prev->disk_name == t->disk_name;          /* one fused tensor, several views */
        prev = t;
        if (alias) continue;
        bytes[t->dtype] += t->nbytes;
        if (view) {
            views++;
            continue;
        }
        on_disk++;
        count[t->dtype]++;
    }
    printf("tensors: %d on disk, %d canonical%s, naming %s\n", on_disk, n, views ? " (fused experts split)" : "",
           dsv4_model_naming(m));
    printf("bytes by dtype:");
    size_t total = 0;
    for (int d = 0; d < DSV4_DTYPE_COUNT; d++)
        if (count[d] || bytes[d]) {
            printf(" %s %zu (%zu tensors);", dsv4_dtype_name((dsv4_dtype)d), bytes[d], count[d]);
            total += bytes[d];
        }
    printf(" total %zu\n", total);
}

static void report_line(void *ctx, const char *line)
{
    int *n = ctx;
    if ((*n)++ == 0) printf("problems:\n");
    printf("  %s\n", line);
}

int dsv4_cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL;
    int digest = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--digest")) {
            digest = 1;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "dsv4 inspect: unexpected argument '%s'\n\n", argv[i]);
            print_help(stderr);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        print_help(stderr);
        return 2;
    }
    dsv4_model *m;
    int rc = dsv4_model_open(dir, &m);
    if (rc) {
        fprintf(stderr, "dsv4 inspect: %s: %s\n", dsv4_err_name(rc), dsv4_last_error());
        return 2;
    }
    printf("model: %s\n", dir);
    print_config(dsv4_model_config(m));
    print_tensors(m);
    if (digest) {
        char hex[65];
        cli_progress pr;
        cli_progress_init(&pr, "dsv4 inspect");
        int cached = 0;
        rc = dsv4_model_weights_digest_cached(m, hex, cli_progress_digest, &pr, &cached);
        cli_progress_end(&pr);
        if (rc) {
            fprintf(stderr, "dsv4 inspect: %s\n", dsv4_last_error());
            dsv4_model_free(m);
            return 2;
        }
        printf("weights_digest: %s%s\n", hex, cached ? " (from the cache)" : "");
    }
    int lines = 0, problems = dsv4_model_check(m, report_line, &lines);
    dsv4_model_free(m);
    if (problems < 0) {
        fprintf(stderr, "dsv4 inspect: %s\n", dsv4_last_error());
        return 2;
    }
    printf("check: %d problem%s\n", problems, problems == 1 ? "" : "s");
    return problems ? 1 : 0;
}
