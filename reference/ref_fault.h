/* ref_fault.h - planted faults for measuring the verifier's power (docs/verify.md "Baseline mode"), TEST BUILDS
 * ONLY.
 *
 * The bugs engines really ship (a RoPE sign, a dropped sink, a short Sinkhorn, ...) are planted at their sites in
 * the CPU reference, so that a verdict can be shown to catch each of them on models no constant was fitted to.
 * One more entry, ALT_ORDER, is not a bug: a second FAITHFUL bf16 implementation (another accumulation order and
 * the attention kernel's tile-wise softmax), the correct candidate that must pass.
 *
 * Only the test-only binary `dsv4_faults` (CMakeLists.txt) compiles reference/ with DSV4_TEST_FAULTS; it reads
 * $DSV4_TEST_FAULT once, when a CPU reference is made. Everywhere else DSV4_FAULT(x) is the constant 0, so every
 * fault site is dead code that the compiler removes (and still type-checks): no release path can reach a fault.
 */
#ifndef DSV4_REF_FAULT_H
#define DSV4_REF_FAULT_H

/* X(enum name, $DSV4_TEST_FAULT value, what it does) */
#define DSV4_REF_FAULTS(X)                                                                                       \
    X(NONE, "none", "no fault")                                                                                  \
    X(ALT_ORDER, "alt-order", "FAITHFUL: every linear sums its inputs in two halves, attention rounds P per "   \
      "32-entry tile against the running maximum (as the mma kernel does)")                                     \
    X(ROPE_SIGN, "rope-sign", "the second half of the query heads rotated by -angle")                           \
    X(SINK_DROPPED, "sink-dropped", "the attention sink left out of the softmax denominator")                    \
    X(SINKHORN_SHORT, "sinkhorn-short", "mHC Sinkhorn one iteration short")                                     \
    X(COMPRESSOR_APE, "compressor-ape", "the compressors add the position bias of window slot (p+1) mod r, "    \
      "one off")                                                                                                \
    X(TOPK_DROP_LAST, "topk-drop-last", "the indexer's top-k drops its last pick")                              \
    X(EXPERT_SCALE, "expert-scale", "routed expert 0's output scaled by 1.02 ($DSV4_TEST_FAULT_SCALE)")         \
    X(KV_TRUNCATE, "kv-truncate", "KV caches (window ring, compressed entries, indexer keys) stored by "        \
      "truncation to bf16 instead of rounding")                                                                 \
    X(SWIGLU_NOCLAMP, "swiglu-noclamp", "the SwiGLU clamp missing")

#define DSV4_REF_FAULT_ENUM(e, name, what) DSV4_FAULT_##e,
typedef enum dsv4_ref_fault { DSV4_REF_FAULTS(DSV4_REF_FAULT_ENUM) DSV4_FAULT_COUNT } dsv4_ref_fault;
#undef DSV4_REF_FAULT_ENUM

#ifdef DSV4_TEST_FAULTS
extern dsv4_ref_fault dsv4_ref_test_fault; /* set by dsv4_ref_fault_init */
extern float dsv4_ref_test_fault_scale;    /* EXPERT_SCALE's factor: $DSV4_TEST_FAULT_SCALE, default 1.02 */
#define DSV4_FAULT(f) (dsv4_ref_test_fault == DSV4_FAULT_##f)
/* Read $DSV4_TEST_FAULT ("" or unset: none). DSV4_ERR_USAGE naming the known faults for another value. */
int dsv4_ref_fault_init(void);
/* The fault's name ("rope-sign"). */
const char *dsv4_ref_fault_name(dsv4_ref_fault f);
/* Record that the fault changed a value at (layer, position): the first such place is printed on stderr when the
 * reference is freed, so that a test can check the verifier's first divergence against it. */
void dsv4_ref_fault_acted(int layer, int position);
/* "dsv4 reference: fault NAME first acted at layer L, position P" (or that it never acted) on stderr. */
void dsv4_ref_fault_report(void);
#else
#define DSV4_FAULT(f) 0
#define dsv4_ref_test_fault_scale 1.0f
#define dsv4_ref_fault_acted(layer, position) ((void)0)
#endif

#endif /* DSV4_REF_FAULT_H */
