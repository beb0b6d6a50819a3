/* tempfile.c - the registry of temporary files being written, cleaned up on SIGINT/SIGTERM/SIGHUP (dsv4.h).
 *
 * Writers (the dump writer, the verifier's JSON/HTML reports) build "<path>.tmp.<pid>" and rename it into place
 * when complete, so a final name never holds a half-written file. A signal would still leave the temporary
 * behind; registered files are unlinked by the handler, which then re-raises the signal with its default
 * action (the exit status still says "killed by SIGINT").
 * Quiet traps:
 * - The handler may only call async-signal-safe functions: the registry is a fixed array of fixed buffers, a
 *   slot is published (state ACTIVE) only after its path is complete, and the handler calls nothing but
 *   unlink, sigaction and raise.
 * - Register BEFORE creating the file and unregister AFTER the rename or unlink: a signal in between unlinks a
 *   name that is absent or already renamed away, which is harmless.
 * - A signal whose disposition is not SIG_DFL (a SIGHUP ignored by nohup) is left alone.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4.h"

#define DSV4_TEMPFILE_SLOTS 64
#define DSV4_TEMPFILE_PATH 4096

enum { SLOT_FREE = 0, SLOT_CLAIMED = 1, SLOT_ACTIVE = 2 };

static struct {
    int state; /* SLOT_*, accessed atomically */
    char path[DSV4_TEMPFILE_PATH];
} dsv4_tempfiles[DSV4_TEMPFILE_SLOTS];

int dsv4_tempfile_register(const char *path)
{
    size_t len = path ? strlen(path) : 0;
    if (!len || len >= DSV4_TEMPFILE_PATH)
        return dsv4_error(DSV4_ERR_USAGE, "temporary file name %s", len ? "too long" : "empty");
    for (int i = 0; i < DSV4_TEMPFILE_SLOTS; i++) {
        int expect = SLOT_FREE;
        if (!__atomic_compare_exchange_n(&dsv4_tempfiles[i].state, &expect, SLOT_CLAIMED, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        memcpy(dsv4_tempfiles[i].path, path, len + 1);
        __atomic_store_n(&dsv4_tempfiles[i].state, SLOT_ACTIVE, __ATOMIC_RELEASE);
        return i;
    }
    return dsv4_error(DSV4_ERR_NOMEM, "%s: more than %d temporary files in progress", path, DSV4_TEMPFILE_SLOTS);
}

void dsv4_tempfile_unregister(int id)
{
    if (id < 0 || id >= DSV4_TEMPFILE_SLOTS) return;
    __atomic_store_n(&dsv4_tempfiles[id].state, SLOT_FREE, __ATOMIC_RELEASE);
}

void dsv4_tempfile_remove_all(void)
{
    for (int i = 0; i < DSV4_TEMPFILE_SLOTS; i++)
        if (__atomic_load_n(&dsv4_tempfiles[i].state, __ATOMIC_ACQUIRE) == SLOT_ACTIVE) unlink(dsv4_tempfiles[i].path);
}

static void dsv4_tempfile_on_signal(int sig)
{
    dsv4_tempfile_remove_all();
    /* SA_RESETHAND restored the default action; the re-raised signal is delivered when the handler returns */
    raise(sig);
}

void dsv4_tempfile_install_signal_handlers(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = dsv4_tempfile_on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        sigaction(sigs[i], &sa, NULL);
    }
}
