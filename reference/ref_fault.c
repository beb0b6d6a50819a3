/* ref_fault.c - the fault switch of the test-only binary dsv4_faults (ref_fault.h). Empty in every other build. */
#include "ref_fault.h"

#ifdef DSV4_TEST_FAULTS
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"

dsv4_ref_fault dsv4_ref_test_fault = DSV4_FAULT_NONE;
float dsv4_ref_test_fault_scale = 1.02f;
static int acted_layer = -1, acted_position = -1;

#define DSV4_REF_FAULT_NAME(e, name, what) name,
static const char *const fault_names[] = {DSV4_REF_FAULTS(DSV4_REF_FAULT_NAME)};
#undef DSV4_REF_FAULT_NAME
_Static_assert(sizeof fault_names / sizeof fault_names[0] == DSV4_FAULT_COUNT, "one name per fault");

const char *dsv4_ref_fault_name(dsv4_ref_fault f) { return f < DSV4_FAULT_COUNT ? fault_names[f] : "?"; }

int dsv4_ref_fault_init(void)
{
    const char *s = getenv("DSV4_TEST_FAULT"), *scale = getenv("DSV4_TEST_FAULT_SCALE");
    acted_layer = acted_position = -1;
    dsv4_ref_test_fault = DSV4_FAULT_NONE;
    dsv4_ref_test_fault_scale = 1.02f;
    if (scale && *scale) {
        char *end;
        double v = strtod(scale, &end);
        if (*end || !(v > 0))
            return dsv4_error(DSV4_ERR_USAGE, "DSV4_TEST_FAULT_SCALE=%s: not a positive number", scale);
        dsv4_ref_test_fault_scale = (float)v;
    }
    if (!s || !*s) return 0;
    for (int f = 0; f < DSV4_FAULT_COUNT; f++)
        if (!strcmp(s, fault_names[f])) {
            dsv4_ref_test_fault = (dsv4_ref_fault)f;
            return 0;
        }
    char known[512];
    size_t len = 0;
    for (int f = 0; f < DSV4_FAULT_COUNT && len < sizeof known; f++)
        len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", f ? ", " : "", fault_names[f]);
    return dsv4_error(DSV4_ERR_USAGE, "DSV4_TEST_FAULT=%s: not a fault (%s)", s, known);
}

void dsv4_ref_fault_acted(int layer, int position)
{
    /* the lowest layer, then its earliest position: baseline verdicts judge a layer over all its positions */
    if (acted_layer < 0 || layer < acted_layer || (layer == acted_layer && position < acted_position)) {
        acted_layer = layer;
        acted_position = position;
    }
}

void dsv4_ref_fault_report(void)
{
    if (dsv4_ref_test_fault == DSV4_FAULT_NONE) return;
    if (acted_layer < 0)
        fprintf(stderr, "dsv4 reference: fault %s never acted\n", fault_names[dsv4_ref_test_fault]);
    else
        fprintf(stderr, "dsv4 reference: fault %s first acted at layer %d, position %d\n",
                fault_names[dsv4_ref_test_fault], acted_layer, acted_position);
}
#else
typedef int dsv4_ref_fault_unused; /* ISO C: a translation unit declares something */
#endif
