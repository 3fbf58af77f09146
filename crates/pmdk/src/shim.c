/*
 * shim.c -- one whole libpmemobj transaction per call, for tiermem-pmdk.
 *
 * libpmemobj's transactions are built on setjmp/longjmp: TX_BEGIN records a jmp_buf and any
 * failure inside the transaction (pmemobj_tx_add_range out of log space, pmemobj_tx_abort, ...)
 * longjmps back to it. A longjmp across Rust frames is undefined behaviour, so the whole
 * transaction -- begin, snapshot, copy, commit, end -- runs in this C function and Rust only sees
 * its return code. No Rust code runs between TX_BEGIN and TX_END.
 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <libpmemobj.h>

/* One write of a transaction: `len` bytes from `src` to `off` bytes into the object. */
struct tm_pmdk_write {
	uint64_t off;
	const void *src;
	size_t len;
};

/*
 * tm_pmdk_tx_write -- in one transaction on `pop`, snapshot each destination range of the object
 * `oid` (pmemobj_tx_add_range, undo log) and memcpy the new bytes over it, then commit. With
 * `abort_at_end` non-zero, abort the transaction after the copies instead of committing (the undo
 * log restores every range).
 *
 * Returns 0 after a commit, else the transaction's error number (ECANCELED after a requested
 * abort). Bounds are the caller's responsibility (the Rust side checks them).
 */
int
tm_pmdk_tx_write(PMEMobjpool *pop, PMEMoid oid, const struct tm_pmdk_write *w, size_t n,
		int abort_at_end)
{
	/* volatile: assigned after the setjmp in TX_BEGIN and read after a possible longjmp. */
	volatile int ret = 0;
	char *base = pmemobj_direct(oid);

	/* Never nest into, or start inside the end of, another transaction of this thread. */
	if (pmemobj_tx_stage() != TX_STAGE_NONE)
		return EINPROGRESS;
	if (base == NULL)
		return EINVAL;

	TX_BEGIN(pop) {
		for (size_t i = 0; i < n; i++) {
			/* On failure this aborts the transaction and longjmps to TX_ONABORT. */
			pmemobj_tx_add_range(oid, w[i].off, w[i].len);
			memcpy(base + w[i].off, w[i].src, w[i].len);
		}
		if (abort_at_end)
			pmemobj_tx_abort(ECANCELED);
	} TX_ONABORT {
		ret = pmemobj_tx_errno();
		if (ret == 0)
			ret = ECANCELED;
	} TX_END

	/* TX_END has run pmemobj_tx_end: the thread is outside any transaction again. */
	if (ret == 0 && pmemobj_tx_stage() != TX_STAGE_NONE)
		ret = EPROTO;
	return ret;
}

/* tm_pmdk_tx_stage -- the calling thread's transaction stage (TX_STAGE_NONE outside one). */
int
tm_pmdk_tx_stage(void)
{
	return (int)pmemobj_tx_stage();
}
