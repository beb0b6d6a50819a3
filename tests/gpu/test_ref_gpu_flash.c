/* test_ref_gpu_flash.c - the GPU reference against the CPU reference on a Flash-width random model (issue 5,
 * "Done when"): D = 4096, 64 heads × 512, 64 indexer heads × 128 (index_topk 512), 4 layers CSA/HCA/CSA/HCA,
 * 32 experts of 2048, vocab 8192 (tests/support/flash_model.h), a 2,600-token prompt (so the CSA layers rank
 * 650 entries for 512 picks at the last positions) and 2 greedy decode steps. Both paths run through `dsv4 run`
 * storing the last prefill position and the decode positions; `dsv4 verify --profile fp32 CPU GPU` must pass.
 * Wall times of generation and of both runs are printed.
 *
 * Environment: DSV4_FLASH_MODEL=DIR keeps (or reuses) the 7.2 GB model there instead of a temp dir;
 * DSV4_FLASH_PROMPT=N changes the prompt length; DSV4_FLASH_CPU=0 runs the GPU side only (timing).
 * `test_ref_gpu_flash --write-model DIR` only writes the model. Without a CUDA device: exit 77 (skipped).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsv4_test.h"
#include "flash_model.h"

enum { FLASH_SEED = 4096, N_DECODE = 2 };

/* run a command, print its output and wall time; returns its exit status */
static int run_timed(const char *label, const char *cmd)
{
    char *out = NULL;
    double t0 = dsv4_test_now_s();
    int rc = dsv4_test_run(cmd, &out);
    printf("---- %s (%.1f s, exit %d)\n$ %s\n%s\n", label, dsv4_test_now_s() - t0, rc, cmd, out ? out : "");
    fflush(stdout);
    free(out);
    return rc;
}

START_TEST(test_flash_gpu_matches_cpu)
{
    const char *keep = getenv("DSV4_FLASH_MODEL");
    char *tmp = dsv4_test_mkdtemp("flash");
    ck_assert_ptr_nonnull(tmp);
    char model[4096], path[4200], cmd[16384];
    snprintf(model, sizeof model, "%s", keep && *keep ? keep : tmp);
    mkdir(model, 0755);
    snprintf(path, sizeof path, "%s/model.safetensors", model);
    struct stat st;
    if (stat(path, &st) != 0) {
        double t0 = dsv4_test_now_s();
        ck_assert_int_eq(dsv4_flash_model_write(model, FLASH_SEED), 0);
        stat(path, &st);
        printf("flash model written to %s: %.2f GB in %.1f s\n", model, st.st_size / 1e9, dsv4_test_now_s() - t0);
    }
    int P = getenv("DSV4_FLASH_PROMPT") ? atoi(getenv("DSV4_FLASH_PROMPT")) : 2600;
    ck_assert_int_ge(P, 1);
    snprintf(path, sizeof path, "%s/prompt.txt", tmp);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < P; i++) fprintf(f, "%d\n", 2 + (int)(((long)i * 7919 + (long)i * i % 8191) % 8190));
    fclose(f);
    const char *bin = dsv4_test_bin();
    const char *paths[2] = {"ref-gpu", "ref-cpu"};
    int n_paths = getenv("DSV4_FLASH_CPU") && !strcmp(getenv("DSV4_FLASH_CPU"), "0") ? 1 : 2;
    for (int i = 0; i < n_paths; i++) {
        snprintf(cmd, sizeof cmd,
                 "%s run --model %s --path %s --prompt-tokens %s --decode %d --dump-positions %d-%d --dump %s/%s.h5",
                 bin, model, paths[i], path, N_DECODE, P - 1, P + N_DECODE - 1, tmp, paths[i]);
        ck_assert_msg(run_timed(paths[i], cmd) == 0, "%s run failed", paths[i]);
    }
    if (n_paths == 2) {
        snprintf(cmd, sizeof cmd, "%s verify --profile fp32 %s/ref-cpu.h5 %s/ref-gpu.h5", bin, tmp, tmp);
        ck_assert_msg(run_timed("verify GPU vs CPU (fp32 profile)", cmd) == 0, "GPU reference diverges from CPU");
    }
    dsv4_test_rmtree(tmp);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-model")) {
        mkdir(argv[2], 0755);
        double t0 = dsv4_test_now_s();
        int rc = dsv4_flash_model_write(argv[2], FLASH_SEED);
        printf("flash model %s in %.1f s\n", rc ? "FAILED" : "written", dsv4_test_now_s() - t0);
        return rc ? 1 : 0;
    }
    dsv4_test_require_gpu();
    Suite *s = suite_create("ref_gpu_flash");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, test_flash_gpu_matches_cpu);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
