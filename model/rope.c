/* rope.c - the RoPE frequency tables of model-spec §3, shared by every path (reference CPU/GPU, optimized):
 * plain base^(-2i/d) for the main table, YaRN-blended for the compress table (no magnitude factor).
 * Computed in fp32 exactly as transformers computes them (its tables equal the official formula), so every path
 * starts from the same bits. The YaRN range is clamped before it becomes an int (config.c refuses a base <= 1, but a
 * base just above 1 still sends ln b to 0). */
#include <math.h>

#include "dsv4/dsv4.h"

/* transformers' find_correction_dim: the rotary dimension whose wavelength fits n_rot turns in L0. */
static double rope_correction_dim(double n_rot, int dim, double base, double l0)
{
    return (dim * log(l0 / (n_rot * 2.0 * 3.14159265358979323846))) / (2.0 * log(base));
}

void dsv4_rope_yarn_range(const dsv4_rope_params *rp, int rope_dim, int *lo, int *hi)
{
    *lo = 0;
    *hi = 0;
    if (!rp->yarn) return;
    double l0 = (double)rp->original_max_position_embeddings;
    double beta_fast = rp->beta_fast > 0 ? rp->beta_fast : 32.0;
    double beta_slow = rp->beta_slow > 0 ? rp->beta_slow : 1.0;
    /* clamped while still double: a base just above 1 (ln b -> 0) or L0 = 0 gives a correction dim of +-inf or past
     * int, which is undefined to convert; every bound it is clamped to lies outside [0, rope_dim) just the same */
    double l = floor(rope_correction_dim(beta_fast, rope_dim, rp->theta, l0));
    double h = ceil(rope_correction_dim(beta_slow, rope_dim, rp->theta, l0));
    *lo = !(l >= 0) ? 0 : l > 1 << 29 ? 1 << 29 : (int)l;                              /* NaN: 0 */
    *hi = !(h <= rope_dim - 1) ? rope_dim - 1 : h < -(1 << 29) ? -(1 << 29) : (int)h; /* NaN: rope_dim - 1 */
}

void dsv4_rope_inv_freq(const dsv4_rope_params *rp, int rope_dim, float *inv_freq)
{
    int n_pairs = rope_dim / 2;
    int lo, hi;
    dsv4_rope_yarn_range(rp, rope_dim, &lo, &hi);
    float span = (float)(hi - lo);
    if (lo == hi) span = (float)((double)hi + 0.001 - lo); /* transformers' singularity guard */
    for (int i = 0; i < n_pairs; i++) {
        float e = (float)(2 * i) / (float)rope_dim;
        float pos_freq = powf((float)rp->theta, e);
        float extra = 1.0f / pos_freq;
        if (!rp->yarn) {
            inv_freq[i] = extra;
            continue;
        }
        float inter = 1.0f / ((float)rp->factor * pos_freq);
        float ramp = ((float)i - (float)lo) / span;
        ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
        float extra_factor = 1.0f - ramp;
        inv_freq[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
    }
}

