/*
 * generations.pml: the claim protocol across two generations of the claim table, for the
 * SPIN model checker. scripts/model.sh runs it (spin -a, gcc, ./pan, exhaustive search).
 *
 * WHAT IS MODELLED
 *
 * One job key k, NC concurrent claimer transactions (3; -DNC=2 for two) and one rotator.
 * Claims live in a unique index per generation table: O (old) and N (new). The shared
 * variable `current` names the generation new claims go to; it starts at O.
 *
 * The rotator runs once, at any point: R1 sets current := N; R2 takes the set of claimers
 * registered on O at that moment and waits until each of them has ended (as WaitForLockers
 * does: a claimer that registers after the snapshot is not waited for); R3 sets sealed.
 *
 * A claimer transaction T:
 *   1. g := current; register on g (RowExclusiveLock on table g, held to the end of T);
 *      read current again: if it is no longer g, go back to 1 (staying registered).
 *   2. Unique check in g, as PostgreSQL's check_exclusion_or_unique_constraint does it
 *      (CEOUC_WAIT): a committed row of another transaction: outcome false. An in-flight
 *      row of T': wait for T''s speculative token if the row is speculative, else for
 *      T''s end; then redo 2.
 *   3. Take a speculative token and insert a speculative row into g. The index insertion
 *      is atomic per generation: if a live row of another transaction is in g at that
 *      moment, the insertion conflicts: kill own row, release the token, go to 2.
 *   4. Cross-check the other generation h with a dirty snapshot:
 *      - no row: go to 5;
 *      - a committed row: kill own row, release the token; outcome false;
 *      - an in-flight row of T', when g = N (the older generation wins): kill own row,
 *        release the token; if T''s row is speculative, wait for its token only (it may
 *        be killed: waiting for T''s end would wait on a transaction that holds no row
 *        of k, and could deadlock with other keys or locks), else for T''s end; go to 1;
 *      - an in-flight speculative row of T', when g = O: wait for T''s token while
 *        holding our own, then redo 4;
 *      - an in-flight confirmed row of T', when g = O: kill own row, release the token,
 *        wait for T''s end; go to 1.
 *   5. Confirm own row, release the token; outcome true.
 *   END: commit or abort, chosen nondeterministically (abort covers a rollback, a rollback
 *      to a savepoint taken before the claim, and a killed backend). On abort T's row
 *      disappears; on commit a confirmed row becomes committed.
 *
 * THE EPOCH (-DEPOCH): step 1 and a step 4a between 3 and 4 change as follows. The
 * rotator's R1 becomes three steps: epoch++; current := N (the publication commits);
 * epoch++. A claimer caches a generation list, {O} (loaded before the commit) or {O, N}
 * (after), with the epoch it read before loading it (loading is a later step than that
 * read, so the rotator may move in between). At the start a claimer either is registered
 * on O already (init decides: an earlier claim of its transaction holds O's lock, and in
 * PostgreSQL it then skips invalidations) with the list {O} at epoch 0, or loads the list.
 *   1. g := the current generation of its list; register on g; read the epoch: if it is
 *      not the cached one, cache the value read, reload the list and go back to 1.
 *   4a. After its insertion, read the epoch again: if it moved, cache it, kill its own row
 *      (releasing its token), reload the list and go back to 1: in PostgreSQL a reload
 *      there would lock the new generations with the token held, which the design never
 *      does. (-DRELOAD_AT_4A instead reloads and goes on with g, the first design: checked
 *      without error as the default at ca796e8, sound here, where locks are not
 *      modelled; scripts/model.sh no longer runs it.) Step 4 cross-checks the other
 *      generation only if it is in the list (a claimer in O with the list {O} goes
 *      straight to 5).
 *   2b. A claimer in N whose list is {O, N} may look for k in O before its insertion, as
 *      a single try_claim does in PostgreSQL (a batch's key after its first does not:
 *      the choice is nondeterministic). A committed row there is its outcome (false); an
 *      in-flight row is waited for (its token if speculative, else its owner's end; the
 *      claimer holds no token yet), then it looks again; a row being deleted, the
 *      deleter's end. If that look found nothing and the list said O was sealed when it
 *      was loaded (a sealed generation gains no row, which the seal property below
 *      asserts), step 4 does not look in O again (src/claim.rs: one probe per sealed
 *      generation, not two). A list loaded while O is sealing keeps step 4.
 *   Each epoch read first waits until the epoch is even (a publication is not between its
 *   two increments). The design as written does not have this wait; without it the
 *   claim is not safe (mutation CACHE_ODD_EPOCH below). In PostgreSQL the wait would be a
 *   short poll: the worker's publication transaction waits for no claimer.
 *
 * THE DELETER (-DDELETER): at any time (or never) it starts deleting k's committed row,
 * in whichever generation it is (dedup.forget, or the old row of a lease that moves): the
 * row becomes DEL, a committed row whose deleter is in progress (a dirty snapshot shows
 * it with xmax set); then it commits (the row is gone, and the key starts a new life:
 * `wins` is reset) or aborts (the row is committed again). One deletion per run.
 *   - In step 2 a DEL row makes the claimer wait for the deleter's end, then redo 2 (as
 *     check_exclusion_or_unique_constraint does); in step 3 it is live, so the insertion
 *     conflicts and goes back to 2.
 *   - In step 4 a DEL row makes the claimer kill its row, release its token, wait for the
 *     deleter's end and go to 1, in either generation.
 *
 * PROPERTIES
 *
 *   - Safety: at each commit with outcome true, no other committed row of k in O or N,
 *     a row being deleted included (COMMITTED <= 1 after the commit; also asserted when
 *     the deleter aborts); at most one transaction commits with outcome true per life of
 *     the key (the counter `wins`, asserted <= 1, reset when a deletion commits).
 *   - Seal: no row is inserted into O once sealed, asserted at every insertion into O,
 *     including an insertion that conflicts and is killed at once.
 *   - No deadlock: every wait is a blocking condition and no statement carries an end
 *     label, so a process may only stop at its last statement; pan reports an invalid end
 *     state when processes remain blocked with none able to move. In PostgreSQL such a
 *     wait cycle ends in a deadlock ERROR, so it counts as a failure here.
 *   - Progress (-DNP, pan -l): no non-progress cycle. There are no progress labels, so
 *     every cycle in the state graph is reported: the check is that every run
 *     terminates, i.e. no endless kill-and-retry loop while another transaction stays
 *     in flight (the protocol's state graph has no cycle at all, so no fairness
 *     assumption is needed).
 *   - Aborts at any step (-DKILL): a killer process may abort any unfinished claimer
 *     before any of its steps, including while it waits (cancel, lock_timeout, the
 *     deadlock detector, a killed backend): its row goes, its token is released, its
 *     lock waits are cancelled, it ends. The killer may stop at any time, so a wait cycle
 *     among the remaining claimers is still reported. -DKILL_ONE allows one abort only.
 *     With 3 claimers and any number of aborts the search stores 2.9e7 states (about
 *     2 minutes and 2 GB), so scripts/model.sh runs that only with --full; by default it
 *     runs any number of aborts with 2 claimers and one abort with 3. With -DEPOCH
 *     -DDELETER, one abort with 3 claimers stores 1.1e8 states (about 4 minutes, 9 GB;
 *     5 minutes and 5.5 GB with pan compiled with -DCOLLAPSE; no error): not run by
 *     scripts/model.sh.
 *
 * WHAT IS ABSTRACTED
 *
 *   - One key; no other keys or tables. Deadlocks through claims of several keys in one
 *     transaction (which exist with one table too, for keys claimed in opposite orders)
 *     are not modelled. Deletions: one deletion of the committed row per run (-DDELETER);
 *     a lease move's insertion of the new row, pruning, and a delete that waits on a row
 *     lock are not modelled. A claimer's own earlier claim of k is not modelled.
 *   - The epoch (-DEPOCH): two generations only, so a list is {O} or {O, N}; the lock on
 *     a generation the claimer may cross-check (ACCESS SHARE) is not modelled (nothing
 *     here conflicts with it); a reload is one atomic read of `current`, made with a new
 *     catalog snapshot. Without -DEPOCH step 1 re-reads `current` directly, as before.
 *   - Each claimer is one transaction with one claim; a later claim of the same key by
 *     the same session is another claimer.
 *   - Sequential consistency: `current`, the lock table and the index pages are read and
 *     written atomically in one global order. In PostgreSQL the lock manager and the
 *     buffer locks give this order for the locks and the index, but the re-read of
 *     `current` in step 1 must see a value published before the rotator took its lock
 *     snapshot in R2: it must not come from a snapshot taken before the lock was
 *     acquired (a REPEATABLE READ transaction snapshot, or the statement's snapshot), and
 *     R1 must be visible (committed) before R2 starts.
 *   - A look-up of one generation's index for k is one atomic step that sees one entry;
 *     when several are live (a conflicting insertion not yet killed, beside the row it
 *     conflicts with), any of them may be the one seen. The real order is fixed by the
 *     index, so this allows more runs, not fewer.
 *   - Taking the token is merged with the insertion, killing the row with releasing the
 *     token, and confirming the row with releasing the token. Nobody can look at the
 *     token before the row exists, and after a kill or a confirmation only transactions
 *     that saw the row before and wait on its token look at the token, so the merged
 *     steps allow the same runs as far as the other transactions can tell.
 *   - Waiting on a token: the waiter records that it waits in the same atomic step in
 *     which it sees the speculative row, and releasing the token wakes every recorded
 *     waiter. This is what waiting on the (xid, token) lock does: when the owner releases
 *     a token and takes a new one, the waiter on the old one still wakes.
 *   - The rotator's wait: ends are permanent, so waiting for each member of the snapshot
 *     in turn is the same as waiting until all of them have ended. WaitForLockers waits
 *     for the whole top-level transaction, also when a savepoint rollback released the
 *     lock earlier: that only delays the seal and is not modelled.
 *   - Registration on N is not tracked: nothing waits on it (there is no later rotation).
 *
 * A SCOPE'S MOVE TO ANOTHER SERIES (src/generations/rotate.rs, publish): the worker moves a
 * scope's route (dedup.generations.routes) only by publishing away from the current
 * generation the scope leaves, in the transaction that writes the new routes, and a claim
 * looks in no other series' current generation. For the keys of that scope this is the
 * -DEPOCH configuration: O is the generation left (sealing, then sealed), N the current
 * generation of the series it goes to, which holds none of its claims (a scope that left
 * a current generation earlier published it away then); a list {O} is the old routes (N,
 * another series' current generation, is not looked in), {O, N} the new ones.
 *
 * TWO SERIES (-DSERIES; not with -DEPOCH): the design before the routes were published.
 * O and N are the current generations of two
 * series (two retentions), O opened before N, so O is "older" in the order that decides
 * who gives way, and both are in every claimer's list from the start. A claimer's scope
 * belongs to either series, and a retention changed at any time moves it from one to the
 * other (the worker's publication of the new mapping moves the epoch, which the claimer
 * reads as above): so step 1 picks O or N anew at each (re)start, and a claimer may move
 * to the *older* generation, which no publication does. There is no rotator (neither
 * generation is sealed while it is current: the seal of either is the one-series protocol
 * above). Step 4 cross-checks the other series' generation as it does the other
 * generation of one series. Sound (no error found), but each claim then probes every
 * series' current generation; -DOWN_SERIES_ONLY below is why a claim may look only in its
 * own series once the routes move only with a publication, and not before.
 *
 * THE PORTABLE EDITION (-DPORTABLE; not with -DEPOCH or -DSERIES): the protocol as SQL can
 * write it (sql/portable/, docs/design/generations.md), which has neither the epoch in
 * shared memory nor a dirty-snapshot look at another index. It runs in a VOLATILE PL/pgSQL
 * function, each step its own statement. A claimer transaction T:
 *   P1. Its transaction begins (it now holds its virtual transaction id, which the
 *      rotation's wait sees); it reads the catalog: lc := current, ls := sealed. In
 *      READ COMMITTED this is the claim's own statement's snapshot; in REPEATABLE READ
 *      (-DRR: each claimer may run in either) the transaction's snapshot, taken when it
 *      began, which later reads see again.
 *   P1b. A generation sealed in that read (O, when g = N) is looked in with a plain
 *      SELECT before the insertion (it gains no row, so one look is enough): a committed
 *      row of k there, outcome false, and no row of T anywhere.
 *   P2. INSERT ... ON CONFLICT DO NOTHING into g := lc: PostgreSQL's own speculative
 *      insertion (steps 2 and 3 above), and at the statement's end its row is confirmed,
 *      in flight. A committed row of k in g: outcome false.
 *   P3. It reads the catalog again. READ COMMITTED: a new snapshot, taken after its row
 *      was inserted. REPEATABLE READ: the catalog row of g is read FOR SHARE, which
 *      returns the row as its snapshot saw it or raises 40001 when a transaction that
 *      committed after that snapshot updated it (a publication away from g): the claimer
 *      aborts. (FOR KEY SHARE would not: it does not conflict with an update that changes
 *      no key, and locks the old version.) The lock is taken in a subtransaction that is
 *      rolled back, so it holds nothing off; the model lets the publication commit at any
 *      time.
 *   P4. Cross-check the other generation h, if the catalog names it and P1b did not look
 *      there (O when g = N; N when g = O and the second read found N current):
 *      - h sealed since the first read (READ COMMITTED only: in REPEATABLE READ the
 *        snapshot's is the first read): a plain SELECT, which sees committed rows only:
 *        a sealed generation gains no row, and its seal waited for every transaction
 *        that could have one in flight there.
 *      - h not sealed: INSERT ... ON CONFLICT DO NOTHING into h, in a subtransaction that
 *        is then rolled back whatever it did: its unique check (step 2) waits for a row
 *        of k in flight there (for its token if speculative, for its owner's end if
 *        confirmed, for the deleter's end if being deleted) and looks again. T holds its
 *        own confirmed row in g meanwhile: two claimers whose rows are in flight in the
 *        two generations can each wait for the other's end. PostgreSQL's deadlock
 *        detector then aborts one of them (40P01; its message is redelivered): the
 *        Detector process below. The row the subtransaction inserts is not modelled: it
 *        waits for nothing while it exists (the insertion's own recheck does not wait), so
 *        it can make another insertion into h wait for its subtransaction's end, which
 *        comes next, and the look is one atomic step here.
 *      A committed row found: T deletes its own row (outcome false). Until T ends, that
 *      row still looks in flight to another insertion of k (a dirty snapshot ignores the
 *      deletion of a row whose inserter is in progress), which waits for T's end; it is
 *      gone from then on, committed or not.
 *   P5. Outcome true; END as above, or (-DPREPARE) PREPARE TRANSACTION first: T gives up
 *      its virtual transaction id and its row stays in flight until COMMIT PREPARED or
 *      ROLLBACK PREPARED.
 * The rotation: R1 the publication commits (current := N); R2 a later transaction records
 * the transactions running then (virtual transaction ids in pg_locks) and polls until each
 * is gone, that is has ended or prepared; then it lists the prepared transactions
 * (pg_prepared_xacts) and waits until each has ended; R3 sealed. Every claimer that read
 * the list {O} began before R1's commit, so it is in R2's set while it may still insert
 * into O, and once prepared it is in the second list.
 * Safety is as above; a claimer aborted by the deadlock detector ends with no row.
 * Mutations of it:
 *   -DP_NO_REREAD (assertion violated: wins <= 1): no step P3. A reads {O}; the
 *     publication commits; B reads {O, N}, inserts into N, cross-checks O (empty),
 *     commits; A inserts into O and, its list {O}, cross-checks nothing.
 *   -DP_WAITS_IN_PUBLICATION (assertion violated: sealed): R2's set is taken in the
 *     publishing transaction, before its commit. A claimer that begins between the two
 *     reads {O}, is not waited for, and inserts into O once it is sealed.
 *   -DP_NO_PREPARED_LIST (with -DPREPARE; assertion violated: wins <= 1): no second list.
 *     A, in R2's set, inserts into O and prepares: its virtual transaction id is gone, so
 *     O is sealed. B reads O sealed, finds no committed row there (A's is in flight),
 *     inserts into N and commits; A is committed.
 *   -DP_RR_SNAPSHOT (with -DRR; assertion violated: wins <= 1): in REPEATABLE READ step
 *     P3 reads the catalog with the transaction's snapshot and no lock: a claimer whose
 *     snapshot predates the publication inserts into O after B's cross-check of O found
 *     nothing, and its second read still says {O}.
 *   -DP_SELECT_UNSEALED (assertion violated: wins <= 1): step P4 looks in a generation
 *     that is not sealed with a plain SELECT: a row in flight there is not seen. A in O
 *     and B in N each find nothing committed in the other and both commit.
 *   -DP_NO_DETECTOR (invalid end state): no deadlock detector. A's row in flight in O,
 *     B's in N, each waiting in its cross-check for the other's end: the wait PostgreSQL
 *     ends with 40P01, which the portable edition's claims can therefore raise across a
 *     publication (the native edition's older generation wins without waiting).
 * Abstracted: two generations only (a claim in PostgreSQL looks in each sealing and
 * sealed generation of every series, each as h is looked in here); one key.
 *
 * MUTATIONS (each must fail; scripts/model.sh checks that pan finds the error named)
 *
 *   -DNO_RECHECK (assertion violated: insertion into O after sealed): step 1 does not read
 *     current again. A claimer reads current = O; the rotator publishes N, takes its
 *     snapshot without that claimer and seals; the claimer registers on O and inserts.
 *     With -DEPOCH: step 1 does not read the epoch; a claimer that loaded {O} before the
 *     publication registers on O after the rotator's snapshot and inserts.
 *   -DCHECK_BEFORE_INSERT (assertion violated: wins <= 1): the cross-check of step 4 runs
 *     before the insertion of step 3 and not after. A claimer in O and one in N each find
 *     the other generation empty, insert into their own, confirm and commit.
 *   -DBOTH_WAIT (invalid end state): a claimer in N that finds a speculative row of T' in
 *     O waits for T''s token while holding its own, as a claimer in O does, instead of
 *     killing its row. Two speculative rows, one in each generation, whose owners each
 *     wait for the other's token.
 *   -DWAIT_END_AFTER_TOKEN (invalid end state): after waiting for T''s token, a claimer
 *     also waits for T''s end, even when T' killed its row: in step 2, and when it gives
 *     way in step 4. B and C register on O; the rotator publishes N. B passed its re-read
 *     before that; C did not and starts over in N, where it inserts and confirms. B
 *     inserts into O, its cross-check finds C's confirmed row: B will give way. C aborts.
 *     A inserts into N; its cross-check finds B's speculative row (B has not killed it
 *     yet): A will give way too. B kills its row, waits for C's end and starts over in N,
 *     where step 2 finds A's speculative row and waits for A's token. A kills its row,
 *     waits for B's token (released already), then for B's end; B, its token wait over,
 *     waits for A's end. Neither has a row, and each waits for the other's end.
 *     PostgreSQL's own check, modelled in step 2, looks again as soon as the token is
 *     released, and so does a claimer that gave way (step 4): B then finds N empty,
 *     inserts, confirms and ends. Either rule alone breaks this cycle here; both are
 *     kept because a wait for the end of a transaction that holds no row of k can close
 *     a cycle through another key or lock of that transaction, which this model, with
 *     one key, cannot show.
 *   -DNO_WAIT (non-progress cycle, with -DNP): a claimer that gives way in step 4 starts
 *     over at once instead of waiting for T'. While T' stays in flight, the claimer in N
 *     inserts, finds T''s row, kills its own and inserts again, without end.
 *   -DNO_EPOCH_AFTER_INSERT (with -DEPOCH; assertion violated: wins <= 1): no step 4a.
 *     A, registered on O with {O} at epoch 0, reads epoch 0 in step 1; the rotator
 *     publishes (epoch 1, commit, epoch 2). B loads {O, N}, inserts into N, cross-checks
 *     O (empty), confirms. A inserts into O, cross-checks nothing (its list is {O}),
 *     confirms. Both commit.
 *   -DCACHE_ODD_EPOCH (with -DEPOCH; assertion violated: wins <= 1): the design as
 *     written: the epoch reads do not wait for an even value. The rotator increments
 *     (epoch 1). A, registered on O with {O} at epoch 0, reads 1 in step 1, caches it and
 *     reloads: the publication has not committed, so the list is {O} at epoch 1. The
 *     publication commits; the second increment has not happened yet. A starts over:
 *     epoch 1, its cache, so it goes on in O. B loads {O, N} at epoch 1, inserts into N,
 *     cross-checks O (empty) and confirms. A inserts into O, reads epoch 1 again in 4a
 *     (unchanged), cross-checks nothing, confirms. Both commit, before the second
 *     increment.
 *   -DONE_INCREMENT (with -DEPOCH; invalid end state): no increment after the commit.
 *     The epoch stays odd, so every claimer waits in its epoch read for ever. (With
 *     -DCACHE_ODD_EPOCH as well it fails as CACHE_ODD_EPOCH does, which the second
 *     increment does not prevent either.)
 *   -DNO_INCREMENT_BEFORE (with -DEPOCH; assertion violated: wins <= 1): the epoch moves
 *     by 2 after the commit only. A, registered on O with {O} at epoch 0, reads 0 in
 *     step 1; the publication commits; B loads {O, N} at epoch 0 (before the increment),
 *     inserts into N, cross-checks O (empty) and confirms; A inserts into O, reads 0 in
 *     4a, cross-checks nothing and confirms.
 *   -DSKIP_UNCHECKED (with -DEPOCH; assertion violated: wins <= 1): step 4 skips a
 *     sealed O also for a claimer that did not look there in step 2b (a batch's key).
 *     A commits its row in O; the rotator publishes and seals; B loads {O, N} with O
 *     sealed, skips 2b, inserts into N, skips 4 and confirms.
 *   -DOWN_SERIES_ONLY (with -DSERIES; assertion violated: wins <= 1): step 4 looks only
 *     in the claimer's own series, as a claim narrowed to the series its scope is mapped
 *     to now would. A, its scope mapped to O's series, inserts into O and confirms; the
 *     scope moves to N's series; B inserts into N, does not look in O, confirms. Both
 *     commit: the series a scope used before stays in its claims' cross-check.
 *   -DOLDER_SKIPS (with -DSERIES; assertion violated: wins <= 1): a claimer in O, the
 *     older generation, does not cross-check N, as if an older generation's claimer could
 *     count on the newer ones to look in it (true of one series, where a claimer in O
 *     whose list has N is one the publication caught). B inserts into N, cross-checks O
 *     (empty) and confirms; A, its scope moved to O's series, inserts into O, skips the
 *     cross-check and confirms. Both commit.
 *   -DNO_WAIT_DELETER (with -DDELETER; assertion violated: wins <= 1): a claimer treats
 *     a row being deleted as gone (step 2: goes on to insert; step 4: confirms). A
 *     commits its row in O; the deleter starts deleting it; B, in N, cross-checks O, finds
 *     the row being deleted, confirms and commits while A's row is still committed: if
 *     the deleter aborts, k has two committed rows.
 */

#ifndef NC
#define NC 3
#endif
#if defined(SERIES) && defined(EPOCH)
#error "SERIES models two series' current generations without a publication: not with EPOCH"
#endif
#if defined(PORTABLE) && (defined(EPOCH) || defined(SERIES))
#error "PORTABLE models the portable edition's protocol: not with EPOCH or SERIES"
#endif
#if defined(PORTABLE) && !defined(KILL)
#define KILLS_ENABLED
#endif
#ifdef KILL
#define KILLS_ENABLED
#endif

#define O 0
#define N 1

/* Row states; a committed row stays after its claimer has ended. DEL: a committed row
 * whose deleter is in progress (a dirty snapshot shows it, with xmax set). */
#define NONE 0
#define SPEC 1
#define CONF 2
#define COMM 3
#define DEL  4

#define B(i) (1 << (i))

bit current = O;
bool sealed = false;
byte rs[NC];     /* rs[i]: state of claimer i's row for k */
bit rg[NC];      /* rg[i]: the generation that row is in */
byte regO;       /* claimers registered on O (lock held), as a bit mask */
byte ended;      /* claimers whose transaction has ended */
byte tokw[NC];   /* tokw[i]: claimers waiting for claimer i's speculative token */
byte wins;       /* commits with outcome true (since the last committed deletion) */
#ifdef KILLS_ENABLED
byte killed;     /* claimers the killer (or the deadlock detector) has aborted */
#endif
#ifdef PORTABLE
byte started;    /* claimers whose transaction has begun */
byte prep;       /* claimers whose transaction is prepared (-DPREPARE) */
byte wend[NC];   /* wend[i]: 1 + the claimer whose end claimer i waits for; 0: none */
#endif
#ifdef EPOCH
byte epoch;      /* the shared-memory epoch */
#endif
#ifdef DELETER
bool dend;       /* the deleter's transaction has ended (or it chose not to delete) */
#endif

/* A live row of another claimer than `me` in generation x, seen by an index scan. */
#define LIVE(j, x) (me != j && rs[j] != NONE && rg[j] == x)
/* A committed row, being deleted or not. */
#define CMT(j) (rs[j] == COMM || rs[j] == DEL)
#if NC >= 3
#define ANY_LIVE(x) (LIVE(0, x) || LIVE(1, x) || LIVE(2, x))
#define COMMITTED (CMT(0) + CMT(1) + CMT(2))
#else
#define ANY_LIVE(x) (LIVE(0, x) || LIVE(1, x))
#define COMMITTED (CMT(0) + CMT(1))
#endif

/* One atomic look-up of generation x: seen := the state of a live row of another
 * claimer (any of them when several are live), NONE if there is none; t := its owner;
 * when the row is speculative, record that we wait for its token. */
inline lookup(x) {
    if
    :: LIVE(0, x) -> t = 0
    :: LIVE(1, x) -> t = 1
#if NC >= 3
    :: LIVE(2, x) -> t = 2
#endif
    :: else -> t = NC
    fi;
    if
    :: t < NC -> seen = rs[t];
       if
       :: seen == SPEC -> tokw[t] = tokw[t] | B(me)
       :: else -> skip
       fi
    :: else -> t = 0; seen = NONE
    fi
}

/* Kill own speculative row and release the token (waking its waiters). */
inline kill_own() {
    atomic { rs[me] = NONE; tokw[me] = 0 }
}

/* The waits: for t's token (a wait lookup recorded), for t's end, for the deleter's end. */
#define WAIT_TOKEN  (!(tokw[t] & B(me)))
#define WAIT_END    (ended & B(t))
#define WAIT_DEL    (dend)

#ifdef EPOCH
/* Read the epoch; if it differs from the cached one, cache the value read and mark the
 * list for a reload (done in the next step, so the rotator may move in between). An odd
 * value means a publication is under way (after the increment before its commit, before
 * the one after): the claimer waits until it is even (in PostgreSQL: polls). The design
 * as written (-DCACHE_ODD_EPOCH) does not. */
inline epoch_read() {
    atomic {
#ifndef CACHE_ODD_EPOCH
        (epoch & 1) == 0;
#endif
        if
        :: epoch != ce -> ce = epoch; reload = true
        :: else
        fi
    }
}
#endif

proctype Claimer(byte me) {
    bit g;
    byte t, seen;
    bool conflict;
#ifdef EPOCH
    bit lc;          /* the cached generation list: O for {O}, N for {O, N} */
    bool ls;         /* and whether it said O was sealed */
    byte ce;         /* the epoch read before that list was loaded */
    bool reload;
    bool pre;        /* step 2b looked in O and found nothing */
#endif

#ifdef KILL
    {
    skip;   /* a block may not start with a label */
#endif
#ifdef EPOCH
    /* the list: a claimer registered on O at the start (init) has it cached from
     * before the publication, {O} with epoch 0; any other loads it now */
    if
    :: regO & B(me)
    :: else -> ce = epoch; atomic { lc = current; ls = sealed }
    fi;
#endif
restart:
#ifdef EPOCH
    /* 1: g := the current generation of the cached list; register on it (take the lock,
     * held to the end of T); read the epoch: if it is not the cached one, reload the list
     * (keeping the epoch read before the reload) and go back to 1 */
    atomic {
        g = lc;
        if
        :: g == O -> regO = regO | B(me)
        :: else
        fi
    }
#ifndef NO_RECHECK
    epoch_read();
    if
    :: reload -> atomic { lc = current; ls = sealed; reload = false; goto restart }
    :: else
    fi;
#endif
#else
#ifdef SERIES
    /* 1: the current generation of the series the claimer's scope is mapped to now: O's
     * series or N's, either at each (re)start; register on it */
    if
    :: g = O
    :: g = N
    fi;
    atomic {
        if
        :: g == O -> regO = regO | B(me)
        :: else
        fi
    }
#else
    /* 1: read current, register on it (take the lock), read current again */
    g = current;
    atomic {
        if
        :: g == O -> regO = regO | B(me)
        :: else
        fi
    }
#ifndef NO_RECHECK
    atomic {
        if
        :: current != g -> goto restart
        :: else
        fi
    }
#endif
#endif
#endif

check:
    /* 2: unique check in g; a wait ends the atomic step (a blocked statement gives up
     * atomicity) */
    atomic {
        lookup(g);
        if
        :: seen == NONE
        :: seen == COMM -> t = 0; seen = 0; goto finish
        :: seen == SPEC -> WAIT_TOKEN;
#ifdef WAIT_END_AFTER_TOKEN
           WAIT_END;
#endif
           t = 0; seen = 0; goto check
        :: seen == CONF -> WAIT_END; t = 0; seen = 0; goto check
#ifdef DELETER
#ifdef NO_WAIT_DELETER
        :: seen == DEL -> t = 0; seen = 0     /* the mutation: as if it were gone */
#else
        :: seen == DEL -> WAIT_DEL; t = 0; seen = 0; goto check
#endif
#endif
        fi
    }

#ifdef EPOCH
    /* 2b: a single claim in N looks in O before its insertion; a batch's key does not */
    pre = false;
    if
    :: g == N && lc == N ->
sealedlook:
       atomic {
           lookup(O);
           if
           :: seen == NONE -> pre = true
           :: seen == COMM -> t = 0; seen = 0; goto finish
           :: seen == SPEC -> WAIT_TOKEN; t = 0; seen = 0; goto sealedlook
           :: seen == CONF -> WAIT_END; t = 0; seen = 0; goto sealedlook
#ifdef DELETER
           :: seen == DEL -> WAIT_DEL; t = 0; seen = 0; goto sealedlook
#endif
           fi
       }
    :: true
    fi;
#endif

#ifdef CHECK_BEFORE_INSERT
precheck:
    /* the mutation: step 4 before step 3, with no own row yet */
    atomic {
        lookup(1 - g);
        if
        :: seen == NONE
        :: seen == COMM -> t = 0; seen = 0; goto finish
        :: seen == SPEC && g == O -> WAIT_TOKEN; t = 0; seen = 0; goto precheck
        :: seen == SPEC && g == N -> WAIT_TOKEN; WAIT_END; t = 0; seen = 0; goto restart
        :: seen == CONF -> WAIT_END; t = 0; seen = 0; goto restart
#ifdef DELETER
        :: seen == DEL -> WAIT_DEL; t = 0; seen = 0; goto restart
#endif
        fi
    }
#endif

    /* 3: take a token and insert a speculative row into g, atomically with the unique
     * index's look for a live row of another claimer (a row being deleted is live); on a
     * conflict, kill the row, release the token and go back to 2 (others may see the row
     * until then) */
    atomic {
        assert(g == N || !sealed);
        conflict = ANY_LIVE(g);
        rs[me] = SPEC;
        rg[me] = g
    }
    if
    :: conflict -> atomic { rs[me] = NONE; tokw[me] = 0; conflict = false; goto check }
    :: else
    fi;

#ifndef CHECK_BEFORE_INSERT
#ifdef EPOCH
#ifndef NO_EPOCH_AFTER_INSERT
    /* 4a: read the epoch again; if it moved, give up the row and the token, reload the
     * list and start over (with -DRELOAD_AT_4A: reload and go on, g stays) */
    epoch_read();
    if
#ifdef RELOAD_AT_4A
    :: reload -> atomic { lc = current; ls = sealed; reload = false }
#else
    :: reload -> kill_own(); atomic { lc = current; ls = sealed; reload = false; goto restart }
#endif
    :: else
    fi;
#endif
    /* a claimer in O whose list is {O} has no other generation to cross-check; one in N
     * whose list said O was sealed and whose step 2b found nothing there skips it */
    if
    :: g == O && lc == O -> goto confirm
#ifdef SKIP_UNCHECKED
    :: g == N && ls -> goto confirm
#else
#ifdef SKIP_ON_PRE
    :: g == N && pre -> goto confirm
#else
    :: g == N && ls && pre -> goto confirm
#endif
#endif
    :: else
    fi;
#endif
#ifdef OWN_SERIES_ONLY
    goto confirm;   /* the mutation: the other series' generation is not looked in */
#endif
#ifdef OLDER_SKIPS
    if              /* the mutation: the older generation's claimer does not look in N */
    :: g == O -> goto confirm
    :: else
    fi;
#endif
xcheck:
    /* 4: cross-check the other generation */
    atomic {
        lookup(1 - g);
        if
        :: seen == NONE
        :: seen == COMM -> rs[me] = NONE; tokw[me] = 0; t = 0; seen = 0; goto finish
#ifdef BOTH_WAIT
        :: seen == SPEC -> WAIT_TOKEN; t = 0; seen = 0; goto xcheck
#else
        :: seen == SPEC && g == O -> WAIT_TOKEN; t = 0; seen = 0; goto xcheck
        :: seen == SPEC && g == N -> skip
#endif
        :: seen == CONF -> skip
#ifdef DELETER
#ifdef NO_WAIT_DELETER
        :: seen == DEL -> seen = NONE         /* the mutation: as if it were gone */
#else
        :: seen == DEL -> skip
#endif
#endif
        fi
    }
    if
    :: seen != NONE ->
       /* in flight, and we give way: kill own row, release the token; if T''s row was
        * speculative wait for its token only, as PostgreSQL's own check does, and start
        * over, looking again (it may have been killed, or confirmed: then the next look
        * waits for T''s end); if it was confirmed, wait for T''s end; if it is being
        * deleted, wait for the deleter's end; start over */
       kill_own();
#ifdef NO_WAIT
       atomic { tokw[t] = tokw[t] & ~B(me); t = 0; seen = 0; goto restart }
#else
#ifdef WAIT_END_AFTER_TOKEN
       atomic { WAIT_TOKEN; WAIT_END; t = 0; seen = 0; goto restart }
#else
       atomic {
           WAIT_TOKEN;
           if
           :: seen == CONF -> WAIT_END
#ifdef DELETER
           :: seen == DEL -> WAIT_DEL
#endif
           :: else
           fi;
           t = 0; seen = 0; goto restart
       }
#endif
#endif
    :: else
    fi;
#endif

confirm:
    /* 5: confirm own row, release the token: outcome true */
    atomic { rs[me] = CONF; tokw[me] = 0 };

finish:
    /* END: commit or abort (rs[me] is CONF with outcome true, NONE with false) */
    if
    :: atomic {
           if
           :: rs[me] == CONF ->
              rs[me] = COMM;
              wins++;
              assert(wins <= 1);
              /* no other committed row of k, in either generation, being deleted or not */
              assert(COMMITTED <= 1)
           :: else
           fi;
           regO = regO & ~B(me);
           ended = ended | B(me)
       }
    :: atomic {
           rs[me] = NONE;
           tokw[me] = 0;
           regO = regO & ~B(me);
           ended = ended | B(me)
       }
    fi
#ifdef KILL
    } unless {
        /* aborted: the row goes, the token is released, the lock waits are cancelled */
        (killed & B(me)) ->
        atomic {
            rs[me] = NONE;
            tokw[me] = 0;
            tokw[0] = tokw[0] & ~B(me);
            tokw[1] = tokw[1] & ~B(me);
#if NC >= 3
            tokw[2] = tokw[2] & ~B(me);
#endif
            t = 0; seen = 0; conflict = false;
#ifdef EPOCH
            reload = false; pre = false;
#endif
            regO = regO & ~B(me);
            ended = ended | B(me)
        }
    }
#endif
}

#ifdef PORTABLE
/* The waits of the portable claimer: a wait for t's end is recorded in wend, which the
 * deadlock detector reads. */
#define PWAIT_END  wend[me] = t + 1; WAIT_END; wend[me] = 0

proctype PClaimer(byte me) {
    bit g, lc;
    bool ls, rr;
    bool pre;       /* O was sealed at the first read, and P1b found nothing there */
    bool zombie;    /* its own row deleted: gone at its end, waited for until then */
    byte t, seen;
    bool conflict;

    {
    skip;   /* a block may not start with a label */
    /* P1: the transaction begins; the catalog as its first statement (READ COMMITTED) or
     * its snapshot (REPEATABLE READ) sees it */
    atomic {
        started = started | B(me);
        lc = current;
        ls = sealed;
#ifdef RR
        if
        :: rr = true
        :: rr = false
        fi
#endif
    }
    g = lc;

    /* P1b: a sealed generation is looked in before the insertion, by a plain SELECT (it
     * gains no row, so one look is enough) */
    if
    :: g == N && ls ->
       atomic {
           if
           :: (rs[0] == COMM || rs[0] == DEL) && rg[0] == O && me != 0 -> goto pfinish
           :: (rs[1] == COMM || rs[1] == DEL) && rg[1] == O && me != 1 -> goto pfinish
#if NC >= 3
           :: (rs[2] == COMM || rs[2] == DEL) && rg[2] == O && me != 2 -> goto pfinish
#endif
           :: else -> pre = true
           fi
       }
    :: else
    fi;

pcheck:
    /* P2: INSERT ... ON CONFLICT DO NOTHING into g: the unique check, then the speculative
     * insertion, confirmed at the statement's end */
    atomic {
        lookup(g);
        if
        :: seen == NONE
        :: seen == COMM -> t = 0; seen = 0; goto pfinish
        :: seen == SPEC -> WAIT_TOKEN; t = 0; seen = 0; goto pcheck
        :: seen == CONF -> PWAIT_END; t = 0; seen = 0; goto pcheck
#ifdef DELETER
        :: seen == DEL -> WAIT_DEL; t = 0; seen = 0; goto pcheck
#endif
        fi
    }
    atomic {
        assert(g == N || !sealed);
        conflict = ANY_LIVE(g);
        rs[me] = SPEC;
        rg[me] = g
    }
    if
    :: conflict -> atomic { rs[me] = NONE; tokw[me] = 0; conflict = false; goto pcheck }
    :: else
    fi;
    atomic { rs[me] = CONF; tokw[me] = 0 };

#ifndef P_NO_REREAD
    /* P3: the catalog again: a new snapshot (READ COMMITTED), or g's row locked
     * (REPEATABLE READ: 40001 if a publication away from g committed after the snapshot) */
    atomic {
        if
#ifdef P_RR_SNAPSHOT
        :: rr -> skip                       /* the mutation: the snapshot's catalog */
#else
        :: rr && current != lc -> goto pabort
        :: rr && current == lc -> skip
#endif
        :: !rr -> lc = current; ls = sealed
        fi
    }
#endif

    /* P4: the other generation, if the catalog names it and P1b did not look there */
    if
    :: g == O && lc == O -> goto pconfirm
    :: g == N && pre -> goto pconfirm
    :: else
    fi;
#ifndef P_SELECT_UNSEALED
    if
    :: !ls || g == O -> goto pxcheck    /* N is current: never sealed here */
    :: else
    fi;
#endif
    /* h sealed since the first read: a plain SELECT sees its committed rows; one found,
     * the claim deletes its own row (which others wait for until its end) */
    atomic {
        if
        :: (rs[0] == COMM || rs[0] == DEL) && rg[0] != g && me != 0 -> zombie = true; goto pfinish
        :: (rs[1] == COMM || rs[1] == DEL) && rg[1] != g && me != 1 -> zombie = true; goto pfinish
#if NC >= 3
        :: (rs[2] == COMM || rs[2] == DEL) && rg[2] != g && me != 2 -> zombie = true; goto pfinish
#endif
        :: else -> goto pconfirm
        fi
    }

pxcheck:
    /* h not sealed: INSERT ... ON CONFLICT DO NOTHING into h in a subtransaction rolled
     * back: its unique check waits for a row in flight, holding T's own row in g */
    atomic {
        lookup(1 - g);
        if
        :: seen == NONE -> goto pconfirm
        :: seen == COMM -> zombie = true; t = 0; seen = 0; goto pfinish
        :: seen == SPEC -> WAIT_TOKEN; t = 0; seen = 0; goto pxcheck
        :: seen == CONF -> PWAIT_END; t = 0; seen = 0; goto pxcheck
#ifdef DELETER
        :: seen == DEL -> WAIT_DEL; t = 0; seen = 0; goto pxcheck
#endif
        fi
    }

pconfirm:
    /* P5: outcome true (the row is confirmed already) */
    skip;

pfinish:
    /* END: commit or abort, or PREPARE TRANSACTION (its virtual transaction id goes, its
     * row stays in flight) and then either (rs[me] is CONF with outcome true or a row
     * deleted, NONE with false and no row) */
#ifdef PREPARE
    if
    :: prep = prep | B(me)
    :: skip
    fi;
#endif
    if
    :: atomic {
           if
           :: rs[me] == CONF && !zombie ->
              rs[me] = COMM;
              wins++;
              assert(wins <= 1);
              assert(COMMITTED <= 1)
           :: else -> rs[me] = NONE
           fi;
           ended = ended | B(me)
       }
    :: atomic {
           rs[me] = NONE;
           tokw[me] = 0;
           ended = ended | B(me)
       }
    fi;
    goto pdone;

pabort:
    /* 40001: the transaction aborts */
    atomic { rs[me] = NONE; tokw[me] = 0; ended = ended | B(me) };
pdone:
    skip
    } unless {
        /* aborted (the killer, or the deadlock detector: 40P01; a prepared transaction
         * rolled back), if it has not ended */
        ((killed & B(me)) && !(ended & B(me))) ->
        atomic {
            rs[me] = NONE;
            tokw[me] = 0;
            tokw[0] = tokw[0] & ~B(me);
            tokw[1] = tokw[1] & ~B(me);
#if NC >= 3
            tokw[2] = tokw[2] & ~B(me);
#endif
            wend[me] = 0;
            t = 0; seen = 0; conflict = false;
            ended = ended | B(me)
        }
    }
}

/* The portable rotation: the publication commits; a later transaction records the
 * transactions running then (their virtual transaction ids) and polls until each is gone
 * (ended, or prepared: a prepared transaction gives up its virtual transaction id), then
 * waits for every prepared transaction there is then; the seal. */
proctype PRotator() {
    byte snap;
#ifdef P_WAITS_IN_PUBLICATION
    snap = started & ~ended;        /* the mutation: recorded before the commit */
    current = N;
#else
    current = N;                    /* R1: the publication commits */
    snap = started & ~ended;        /* R2: the transactions running now ... */
#endif
    ((snap & (ended | prep)) == snap);   /* ... each of them has ended or prepared */
#ifndef P_NO_PREPARED_LIST
    snap = prep & ~ended;           /*     the prepared transactions now ... */
    ((snap & ended) == snap);       /*     ... each of them has ended */
#endif
    atomic { snap = 0; sealed = true }   /* R3 */
}

/* PostgreSQL's deadlock detector: a cycle of claimers each waiting for the next one's end
 * (two or three of them) is broken by aborting one of them, any one. */
#define WE(i, j) (wend[i] == j + 1 && !(killed & B(i)))
proctype Detector() {
end:
    do
    :: atomic { WE(0, 1) && WE(1, 0) ->
           if
           :: killed = killed | B(0)
           :: killed = killed | B(1)
           fi }
#if NC >= 3
    :: atomic { WE(0, 2) && WE(2, 0) ->
           if
           :: killed = killed | B(0)
           :: killed = killed | B(2)
           fi }
    :: atomic { WE(1, 2) && WE(2, 1) ->
           if
           :: killed = killed | B(1)
           :: killed = killed | B(2)
           fi }
    :: atomic { (WE(0, 1) && WE(1, 2) && WE(2, 0)) || (WE(0, 2) && WE(2, 1) && WE(1, 0)) ->
           if
           :: killed = killed | B(0)
           :: killed = killed | B(1)
           :: killed = killed | B(2)
           fi }
#endif
    od
}
#endif

proctype Rotator() {
    byte snap;
#ifdef EPOCH
#ifndef NO_INCREMENT_BEFORE
    epoch++;                        /* R1: the epoch before the publication commits, */
#endif
    current = N;                    /*     the publication, */
#ifdef NO_INCREMENT_BEFORE
    epoch = epoch + 2;              /*     the mutation: only after the commit */
#else
#ifndef ONE_INCREMENT
    epoch++;                        /*     the epoch again */
#endif
#endif
#else
    current = N;                    /* R1: publish */
#endif
    snap = regO;                    /* R2: the lockers of O at this moment ... */
    ((snap & ended) == snap);       /*     ... each of them has ended */
    atomic { snap = 0; sealed = true }   /* R3 */
}

#ifdef DELETER
/* One deletion of k's committed row (dedup.forget, the old row of a lease that moves),
 * started at any time, in whichever generation the row is; or none. */
proctype Deleter() {
    byte j;
    atomic {
        if
        :: rs[0] == COMM -> j = 0
        :: rs[1] == COMM -> j = 1
#if NC >= 3
        :: rs[2] == COMM -> j = 2
#endif
        :: true -> j = NC
        fi;
        if
        :: j < NC -> rs[j] = DEL
        :: else -> dend = true; goto done
        fi
    }
    if
    :: atomic { rs[j] = NONE; wins = 0; j = 0; dend = true }      /* commit: a new life */
    :: atomic { rs[j] = COMM; assert(COMMITTED <= 1); j = 0; dend = true }   /* abort */
    fi;
done:
    skip
}
#endif

#ifdef KILL
/* Aborts unfinished claimers (any number of them, or one with -DKILL_ONE), each at any
 * step; may stop at any time. */
#ifdef KILL_ONE
#define KILLS(i) :: !((ended | killed) & B(i)) -> killed = killed | B(i); break
#else
#define KILLS(i) :: !((ended | killed) & B(i)) -> killed = killed | B(i)
#endif
proctype Killer() {
    do
    KILLS(0)
    KILLS(1)
#if NC >= 3
    KILLS(2)
#endif
    :: break
    od
}
#endif

init {
    byte i;
    atomic {
#ifdef PORTABLE
        for (i : 0 .. NC - 1) {
            run PClaimer(i)
        }
        run PRotator();
#ifndef P_NO_DETECTOR
        run Detector();
#endif
#else
        for (i : 0 .. NC - 1) {
#ifdef EPOCH
            /* claimer i may be registered on O already, by an earlier claim of its
             * transaction, with the list {O} cached at epoch 0 */
            if
            :: regO = regO | B(i)
            :: skip
            fi;
#endif
            run Claimer(i)
        }
#ifndef SERIES
        run Rotator();
#endif
#endif
#ifdef DELETER
        run Deleter();
#endif
#ifdef KILL
        run Killer()
#endif
    }
}
