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
 * PROPERTIES
 *
 *   - Safety: at most one committed row for k across O and N, asserted at each commit
 *     (the only step that makes a committed row); at most one transaction commits with
 *     outcome true (the counter `wins`, asserted <= 1).
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
 *     runs any number of aborts with 2 claimers and one abort with 3.
 *
 * WHAT IS ABSTRACTED
 *
 *   - One key; no other keys or tables. Deadlocks through claims of several keys in one
 *     transaction (which exist with one table too, for keys claimed in opposite orders)
 *     are not modelled, nor are deletions (pruning) of rows.
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
 * MUTATIONS (each must fail; scripts/model.sh checks that pan finds the error named)
 *
 *   -DNO_RECHECK (assertion violated: insertion into O after sealed): step 1 does not read
 *     current again. A claimer reads current = O; the rotator publishes N, takes its
 *     snapshot without that claimer and seals; the claimer registers on O and inserts.
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
 */

#ifndef NC
#define NC 3
#endif

#define O 0
#define N 1

/* Row states; a committed row stays after its claimer has ended. */
#define NONE 0
#define SPEC 1
#define CONF 2
#define COMM 3

#define B(i) (1 << (i))

bit current = O;
bool sealed = false;
byte rs[NC];     /* rs[i]: state of claimer i's row for k */
bit rg[NC];      /* rg[i]: the generation that row is in */
byte regO;       /* claimers registered on O (lock held), as a bit mask */
byte ended;      /* claimers whose transaction has ended */
byte tokw[NC];   /* tokw[i]: claimers waiting for claimer i's speculative token */
byte wins;       /* commits with outcome true */
#ifdef KILL
byte killed;     /* claimers the killer has aborted */
#endif

/* A live row of another claimer than `me` in generation x, seen by an index scan. */
#define LIVE(j, x) (me != j && rs[j] != NONE && rg[j] == x)
#if NC >= 3
#define ANY_LIVE(x) (LIVE(0, x) || LIVE(1, x) || LIVE(2, x))
#define COMMITTED ((rs[0] == COMM) + (rs[1] == COMM) + (rs[2] == COMM))
#else
#define ANY_LIVE(x) (LIVE(0, x) || LIVE(1, x))
#define COMMITTED ((rs[0] == COMM) + (rs[1] == COMM))
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

/* The two waits: for t's token (a wait lookup recorded), and for t's end. */
#define WAIT_TOKEN  (!(tokw[t] & B(me)))
#define WAIT_END    (ended & B(t))

proctype Claimer(byte me) {
    bit g;
    byte t, seen;
    bool conflict;

#ifdef KILL
    {
    skip;   /* a block may not start with a label */
#endif
restart:
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
        fi
    }

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
        fi
    }
#endif

    /* 3: take a token and insert a speculative row into g, atomically with the unique
     * index's look for a live row of another claimer; on a conflict, kill the row,
     * release the token and go back to 2 (others may see the row until then) */
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
        fi
    }
    if
    :: seen != NONE ->
       /* in flight, and we give way: kill own row, release the token; if T''s row was
        * speculative wait for its token only, as PostgreSQL's own check does, and start
        * over, looking again (it may have been killed, or confirmed: then the next look
        * waits for T''s end); if it was confirmed, wait for T''s end; start over */
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
           :: else
           fi;
           t = 0; seen = 0; goto restart
       }
#endif
#endif
    :: else
    fi;
#endif

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
            regO = regO & ~B(me);
            ended = ended | B(me)
        }
    }
#endif
}

proctype Rotator() {
    byte snap;
    current = N;                    /* R1: publish */
    snap = regO;                    /* R2: the lockers of O at this moment ... */
    ((snap & ended) == snap);       /*     ... each of them has ended */
    atomic { snap = 0; sealed = true }   /* R3 */
}

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
        for (i : 0 .. NC - 1) {
            run Claimer(i)
        }
        run Rotator();
#ifdef KILL
        run Killer()
#endif
    }
}
