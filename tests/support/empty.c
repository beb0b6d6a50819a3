/* empty.c - keeps the test-support library non-empty whatever else tests/support/ holds. */
typedef int dsv4_test_support_nonempty;
