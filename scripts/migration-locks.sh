#!/usr/bin/env bash
# What each migration of the books costs a live sale (BENCHMARKS.md "What
# does an upgrade cost?"): on a PRIVATE mariadbd (its own datadir under /tmp,
# its own port; never the shared 3306), applies migrations/*.sql in file-name
# order as sqlx does, fills the hot tables once when they are created
# (tb_order, tb_event, tb_sale_second; tb_product a few thousand rows), and
# applies every migration that ALTERs or indexes a table while a second
# connection writes to the hot table it alters (an INSERT or UPDATE every
# 10 ms, each timed). Prints, per migration: its duration, the longest wait a
# write saw while it ran ("blocks writes"), and whether MariaDB accepts each
# of its ALTERs with ALGORITHM=INSTANT and with ALGORITHM=INPLACE, LOCK=NONE
# (tried on an empty twin of the table as it was just before). A migration
# that stalled writes more than 1 s is then undone and its ALTER on the hot
# table run again in the online form MariaDB accepts, timed the same way
# (ONLINE=0: not). Last, a control: one index built on tb_order with
# LOCK=SHARED, then LOCK=NONE, to show what a blocking form looks like.
#
#   scripts/migration-locks.sh                      # 5M orders, 10M events (the figures)
#   ORDERS=200000 scripts/migration-locks.sh        # a quick run (about a minute)
#   ORDERS=1000000 EVENTS=2000000 KEEP=1 scripts/migration-locks.sh   # keep the datadir
#
# Env: ORDERS (5,000,000), EVENTS (2 × ORDERS), SALE_SECONDS (tb_sale_second
# rows, ORDERS / 10), PRODUCTS (3,000), PORT (3427), BUFFER_POOL (4G),
# LIMIT (seconds any one fill chunk or migration may take, 1800),
# STALL_LIMIT (a stall longer than this, in s, runs the migration again
# online, 1), ONLINE=0 (never again online), CONTROL=0 (no control).
# The server is shut down and its datadir removed on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
ORDERS=${ORDERS:-5000000}
EVENTS=${EVENTS:-$((ORDERS * 2))}
SALE_SECONDS=${SALE_SECONDS:-$((ORDERS / 10))}
PRODUCTS=${PRODUCTS:-3000}
PORT=${PORT:-3427}
BUFFER_POOL=${BUFFER_POOL:-4G}
LIMIT=${LIMIT:-1800}
ONLINE=${ONLINE:-1}
STALL_LIMIT=${STALL_LIMIT:-1}
CONTROL=${CONTROL:-1}
CHUNK=500000
HOT="tb_order tb_event tb_payment tb_sale_second tb_delivery"

dir=$(mktemp -d /tmp/migration-locks.XXXXXX)
sock=$dir/mariadb.sock
server_pid=
cleanup() {
    set +e
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        timeout 60 mariadb-admin --no-defaults -S "$sock" -uroot shutdown 2>/dev/null
        for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$server_pid" 2>/dev/null && kill -9 "$server_pid"
    fi
    if [ "${KEEP:-0}" = 1 ]; then echo "datadir kept: $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

sql() { mariadb --no-defaults -S "$sock" -uroot -N -B flashsale "$@"; }
now() { echo "$EPOCHREALTIME"; }
log() { printf '%s  %s\n' "$(date +%T)" "$*" >&2; }

# --- the private server ---------------------------------------------------
mariadb-install-db --no-defaults --datadir="$dir/data" --user=root \
    --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1
/usr/sbin/mariadbd --no-defaults --datadir="$dir/data" --port="$PORT" --bind-address=127.0.0.1 \
    --socket="$sock" --pid-file="$dir/mariadb.pid" --tmpdir="$dir" --user=root \
    --skip-name-resolve --max-connections=50 --innodb-buffer-pool-size="$BUFFER_POOL" \
    --innodb-log-file-size=1G --innodb-flush-log-at-trx-commit=1 >"$dir/mariadb.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 150); do
    mariadb --no-defaults -S "$sock" -uroot -e 'SELECT 1' >/dev/null 2>&1 && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$dir/mariadb.log" >&2; exit 1; }
    sleep 0.2
done
mariadb --no-defaults -S "$sock" -uroot -e 'CREATE DATABASE flashsale'
log "private mariadbd $(sql -e 'SELECT VERSION()') on 127.0.0.1:$PORT, datadir $dir/data"

# --- helpers (python3, standard library only) -----------------------------
# parse.py FILE: one line per ALTER TABLE / CREATE INDEX statement:
# table<TAB>kind<TAB>statement on one line (comments stripped).
cat >"$dir/parse.py" <<'PY'
import re, sys
text = re.sub(r"--[^\n]*", "", open(sys.argv[1]).read())
for stmt in (s.strip() for s in text.split(";")):
    one = " ".join(stmt.split())
    m = re.match(r"(?i)alter\s+table\s+`?(\w+)`?\s+(.*)", one)
    if m:
        clauses, depth, cur = [], 0, ""
        for ch in m.group(2):
            depth += ch == "("
            depth -= ch == ")"
            if ch == "," and depth == 0:
                clauses.append(cur.strip()); cur = ""
            else:
                cur += ch
        clauses.append(cur.strip())
        kinds = []
        for c in clauses:
            w = c.upper().split()
            k = " ".join(w[:2]) if w[0] in ("ADD", "DROP") else w[0]
            k = {"ADD KEY": "ADD INDEX", "DROP KEY": "DROP INDEX"}.get(k, k)
            if k == "MODIFY" or k == "MODIFY COLUMN":
                k = "MODIFY COLUMN"
            if k not in kinds:
                kinds.append(k)
        print(f"{m.group(1)}\t{', '.join(kinds)}\t{one}")
        continue
    m = re.match(r"(?i)create\s+(?:unique\s+)?index\s+\S+\s+on\s+`?(\w+)`?", one)
    if m:
        print(f"{m.group(1)}\tCREATE INDEX\t{one}")
PY

# writer.py SOCKET TABLE STOPFILE OUT MAXSECS: one connection (the mariadb
# client, fed a statement at a time), a write every 10 ms, each timed from
# sending to its answer; a write that waits delays the next (as a worker's
# would). OUT: "sent_epoch seconds" per write.
cat >"$dir/writer.py" <<'PY'
import os, random, subprocess, sys, time
sock, table, stop, out, maxsecs = sys.argv[1:6]
orders, products = int(os.environ["ORDERS"]), int(os.environ["PRODUCTS"])
p = subprocess.Popen(["mariadb", "--no-defaults", "-S", sock, "-uroot", "-N", "-B", "-n", "--force",
                      "flashsale"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=open(out + ".err", "w"), text=True, bufsize=1)
rnd = random.Random(7)
def statement(k):
    ms = int(time.time() * 1000)
    if table == "tb_order":
        if k % 2:
            prod = rnd.randint(1, products)
            oid = f"sku-{prod}:{ms:012x}{rnd.getrandbits(96):024x}"
            return (f"INSERT INTO tb_order (order_id,user_id,product_id,quantity,price,status,created,updated) "
                    f"VALUES ('{oid}',{rnd.randint(1, 10**6)},'sku-{prod}',1,4999.00,'confirmed',{ms},{ms})")
        return f"UPDATE tb_order SET status='paid', updated={ms} WHERE id={rnd.randint(1, orders)}"
    if table == "tb_event":
        return (f"INSERT INTO tb_event (type,order_id,created) "
                f"VALUES ('order.paid','sku-1:{ms:012x}{rnd.getrandbits(96):024x}',{ms})")
    if table == "tb_sale_second":
        return (f"INSERT INTO tb_sale_second (product_id,second,source,counts,gauges,latency) VALUES "
                f"('sku-1',{ms // 1000},'live-{k % 4}','{{\"orders\":{k}}}','{{}}','{{}}') "
                f"ON DUPLICATE KEY UPDATE counts=VALUES(counts)")
    if table == "tb_sale_audit":
        return (f"INSERT INTO tb_sale_audit (product_id,initial_qty,redis_stock,confirmed,paid,cancelled,"
                f"available_qty,orders,repaired_orders,repaired_units,repaired_releases,repaired_idem,retired) "
                f"VALUES ('sku-{k % products + 1}',1000,0,0,1000,0,0,1000,0,0,0,0,{ms}) "
                f"ON DUPLICATE KEY UPDATE retired=VALUES(retired)")
    if table == "tb_sale_report":
        return (f"INSERT INTO tb_sale_report (product_id,report,made) VALUES ('sku-{k % products + 1}','{{}}',{ms}) "
                f"ON DUPLICATE KEY UPDATE made=VALUES(made)")
    return f"UPDATE {table} SET updated={ms} WHERE id={rnd.randint(1, products)}"
with open(out, "w") as f:
    start, k, nxt = time.time(), 0, time.time()
    while not os.path.exists(stop) and time.time() - start < float(maxsecs):
        k += 1
        sent = time.time()
        p.stdin.write(f"{statement(k)}; SELECT 'w{k}';\n")
        p.stdin.flush()
        while p.stdout.readline().strip() != f"w{k}":
            pass
        f.write(f"{sent:.6f} {time.time() - sent:.6f}\n")
        nxt = max(nxt + 0.01, time.time())
        time.sleep(max(0.0, nxt - time.time()))
p.stdin.close()
p.wait()
PY

# stall.py OUT T0 T1: the writes that were waiting at some time in [T0, T1].
cat >"$dir/stall.py" <<'PY'
import sys
out, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rows = [tuple(map(float, l.split())) for l in open(out) if l.strip()]
during = [lat for sent, lat in rows if sent <= t1 and sent + lat >= t0]
before = [lat for sent, lat in rows if sent + lat < t0]
during.sort()
p99 = during[min(len(during) - 1, int(len(during) * 0.99))] if during else 0
print(f"{max(during, default=0):.3f} {p99:.3f} {len(during)} {max(before, default=0):.3f}")
PY

# --- the fill ---------------------------------------------------------------
T0=1796000000000 # epoch ms: 2026-11-30
oid() { # the order id of order number $1 (SQL), as OrderId::generate makes them
    echo "CONCAT('sku-', ($1) % $PRODUCTS + 1, ':', LPAD(LOWER(HEX($T0 + ($1) * 20)), 12, '0'), LEFT(MD5($1), 24))"
}
chunks() { # total body-with-@A-@B: runs body per chunk of seq values
    local total=$1 body=$2 a b
    for ((a = 1; a <= total; a += CHUNK)); do
        b=$((a + CHUNK - 1 < total ? a + CHUNK - 1 : total))
        timeout "$LIMIT" mariadb --no-defaults -S "$sock" -uroot flashsale \
            -e "${body//@SEQ/seq_${a}_to_${b}}"
    done
}
fill_fast() { sql -e "SET GLOBAL innodb_flush_log_at_trx_commit = 0"; }
settle() { # back to durable commits, and the fill's dirty pages written out
    local cap
    cap=$(sql -e "SELECT CONCAT(@@innodb_io_capacity, ' ', @@innodb_io_capacity_max)")
    sql -e "SET GLOBAL innodb_flush_log_at_trx_commit = 1; SET GLOBAL innodb_max_dirty_pages_pct = 0;
            SET GLOBAL innodb_io_capacity_max = 40000; SET GLOBAL innodb_io_capacity = 20000"
    for _ in $(seq 1 600); do
        [ "$(sql -e "SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'" | cut -f2)" -lt 100 ] && break
        sleep 1
    done
    sql -e "SET GLOBAL innodb_max_dirty_pages_pct = 90;
            SET GLOBAL innodb_io_capacity = ${cap% *}; SET GLOBAL innodb_io_capacity_max = ${cap#* }"
}
fill_after() { # the migration just applied created a table to fill
    local t0 created
    t0=$(now)
    created=$(grep -oiE "create table( if not exists)? +(tb_order|tb_event|tb_sale_second) " "$1" | awk '{ print $NF }' | head -1 || true)
    case $created in
    tb_order)
        fill_fast
        sql -e "INSERT INTO tb_product (product_id, price, available_qty, title, start_time, end_time, created, updated)
                SELECT CONCAT('sku-', seq), 4999.00, 1000, CONCAT('Product ', seq), $T0, $T0 + 86400000, $T0, $T0
                FROM seq_1_to_$PRODUCTS"
        chunks "$ORDERS" "INSERT INTO tb_order (order_id, user_id, product_id, quantity, price, status, created, updated)
            SELECT $(oid seq), 1 + (seq * 7919) % 1000000, CONCAT('sku-', seq % $PRODUCTS + 1), 1, 4999.00,
                   ELT(1 + seq % 10, 'paid','paid','paid','paid','paid','paid','paid','cancelled','confirmed','confirmed'),
                   $T0 + seq * 20, $T0 + seq * 20 + 60000
            FROM @SEQ"
        settle
        log "filled tb_product ($PRODUCTS) and tb_order ($ORDERS) in $(python3 -c "print(f'{$(now)-$t0:.0f}')") s"
        ;;
    tb_event)
        fill_fast
        chunks "$EVENTS" "INSERT INTO tb_event (type, order_id, created)
            SELECT IF(e % 2, 'order.confirmed', ELT(1 + s % 10, 'order.paid','order.paid','order.paid','order.paid',
                   'order.paid','order.paid','order.paid','order.cancelled','order.confirmed','order.confirmed')),
                   $(oid s), $T0 + e * 10
            FROM (SELECT seq AS e, ((seq - 1) DIV 2) % $ORDERS + 1 AS s FROM @SEQ) x"
        settle
        log "filled tb_event ($EVENTS) in $(python3 -c "print(f'{$(now)-$t0:.0f}')") s"
        ;;
    tb_sale_second)
        fill_fast
        # 50 sales' timelines, 4 processes each, one row per second and process.
        chunks "$SALE_SECONDS" "INSERT INTO tb_sale_second (product_id, second, source, counts, gauges, latency)
            SELECT CONCAT('sku-', seq % 50 + 1), $((T0 / 1000)) + seq DIV 200, CONCAT('src-', (seq DIV 50) % 4),
                   CONCAT('{\"orders\":', seq % 97, ',\"accepted\":', seq % 89, ',\"sold_out\":', seq % 7, '}'),
                   CONCAT('{\"room_waiting\":', seq % 500, ',\"room_admitted\":', seq % 300, '}'),
                   CONCAT('{\"le_1\":', seq % 80, ',\"le_5\":', seq % 20, ',\"le_25\":', seq % 3, '}')
            FROM @SEQ"
        settle
        log "filled tb_sale_second ($SALE_SECONDS) in $(python3 -c "print(f'{$(now)-$t0:.0f}')") s"
        ;;
    esac
}

# --- the online forms, on an empty twin of the table as it is now ---------
forms() { # migration file -> "table: INSTANT yes|no, INPLACE+NONE yes|no; ..."
    local table kind stmt rest res=() i s
    while IFS=$'\t' read -r table kind stmt; do
        [[ $stmt =~ ^[Aa][Ll][Tt][Ee][Rr]\ +[Tt][Aa][Bb][Ll][Ee]\ +\`?$table\`?\ +(.*)$ ]] || continue
        rest=${BASH_REMATCH[1]}
        i=$table:
        for form in "ALGORITHM=INSTANT" "ALGORITHM=INPLACE, LOCK=NONE"; do
            if sql -e "DROP TABLE IF EXISTS twin; CREATE TABLE twin LIKE $table;
                       ALTER TABLE twin $rest, $form" >/dev/null 2>"$dir/form.err"; then
                s=yes
            else
                s=no
            fi
            [ "$form" = ALGORITHM=INSTANT ] && i="$i INSTANT $s," || i="$i INPLACE+LOCK=NONE $s"
        done
        res+=("$i")
    done < <(python3 "$dir/parse.py" "$1")
    sql -e "DROP TABLE IF EXISTS twin"
    local IFS=';' all
    all="${res[*]}"
    echo "${all//;/; }"
}

# --- one migration under writes -------------------------------------------
measured() { # FILE_OR_SQL TABLE -> "duration stall p99 writes baseline"
    local what=$1 table=$2 out=$dir/writes.$RANDOM t0 t1 wpid
    rm -f "$dir/stop"
    ORDERS=$ORDERS PRODUCTS=$PRODUCTS python3 "$dir/writer.py" "$sock" "$table" "$dir/stop" "$out" \
        $((LIMIT + 120)) &
    wpid=$!
    sleep 2 # the writes' baseline
    t0=$(now)
    if [ -f "$what" ]; then
        timeout "$LIMIT" mariadb --no-defaults -S "$sock" -uroot flashsale <"$what"
    else
        timeout "$LIMIT" mariadb --no-defaults -S "$sock" -uroot flashsale -e "$what"
    fi
    t1=$(now)
    sleep 1
    touch "$dir/stop"
    wait "$wpid"
    [ -s "$out.err" ] && { log "the writer's errors:"; head -5 "$out.err" >&2; }
    echo "$(python3 -c "print(f'{$t1 - $t0:.3f}')") $(python3 "$dir/stall.py" "$out" "$t0" "$t1")"
}

# --- a stalling one again, online -----------------------------------------
# Undo the migration's change to the hot table, then its ALTER again with the
# online form MariaDB takes (INSTANT first), timed under writes as before
# (right after the migration: the undo is exact, later ones see the same).
online=()
again_online() { # name table
    local name=$1 table=$2 stmt rest undo form
    stmt=$(python3 "$dir/parse.py" "migrations/$name.sql" | awk -F'\t' -v t="$table" '$1 == t { print $3; exit }')
    rest=${stmt#* "$table" }
    undo=$(python3 - "$rest" "$table" <<'PY'
import re, sys
rest, table = sys.argv[1], sys.argv[2]
undo = []
for c in re.split(r",\s*(?![^()]*\))", rest):
    w = c.split()
    if w[0].upper() == "ADD" and w[1].upper() in ("KEY", "INDEX"):
        undo.append(f"DROP KEY {w[2]}")
    elif w[0].upper() == "ADD" and w[1].upper() == "COLUMN" and w[2].upper() != "IF":
        undo.append(f"DROP COLUMN {w[2]}")
    else:
        undo.append("?" + c)
print(f"ALTER TABLE {table} " + ", ".join(undo) if not any(u.startswith("?") for u in undo) else "")
PY
)
    if [ -z "$undo" ]; then
        log "$name: not undone automatically (${rest}): not run again"
        online+=("$name|$table|not run again (no automatic undo)|||")
        return
    fi
    sql -e "$undo"
    for form in "ALGORITHM=INSTANT" "ALGORITHM=INPLACE, LOCK=NONE"; do
        if sql -e "DROP TABLE IF EXISTS twin; CREATE TABLE twin LIKE $table; ALTER TABLE twin $rest, $form" \
            >/dev/null 2>"$dir/form.err"; then
            sql -e "DROP TABLE IF EXISTS twin"
            read -r dur stall p99 n base < <(measured "ALTER TABLE $table $rest, $form" "$table")
            log "$name again with $form: ${dur} s, longest write ${stall} s (p99 ${p99} s)"
            online+=("$name|$table|$form|$dur|$stall|$p99")
            return
        fi
        log "$name: MariaDB refuses $form: $(tail -1 "$dir/form.err")"
    done
    sql -e "DROP TABLE IF EXISTS twin; $stmt" # neither: as the migration had it
    online+=("$name|$table|refused: INSTANT and INPLACE+LOCK=NONE|||")
}

rows=()
for f in migrations/*.sql; do
    name=$(basename "$f" .sql)
    parsed=$(python3 "$dir/parse.py" "$f")
    if [ -z "$parsed" ]; then
        sql <"$f"
        fill_after "$f"
        continue
    fi
    # The writes go to the hot table the migration alters (else its first).
    tables=$(cut -f1 <<<"$parsed")
    table=$(head -1 <<<"$tables")
    for t in $tables; do [[ " $HOT " == *" $t "* ]] && { table=$t; break; }; done
    kind=$(awk -F'\t' -v t="$table" '$1 == t { print $2; exit }' <<<"$parsed")
    form=$(forms "$f")
    read -r dur stall p99 n base < <(measured "$f" "$table")
    size=$(sql -e "SELECT COUNT(*) FROM $table")
    log "$name: $kind on $table ($size rows): ${dur} s, longest write ${stall} s (p99 ${p99} s, $n writes; before ${base} s)"
    rows+=("$name|$table|$kind|$size|$dur|$stall|$p99|$form")
    if [ "$ONLINE" = 1 ] && python3 -c "import sys; sys.exit(0 if $stall > $STALL_LIMIT else 1)"; then
        again_online "$name" "$table"
    fi
    fill_after "$f"
done

# --- the control: what a blocking form of an index build costs -----------
# The same index on tb_order built with LOCK=SHARED (writes wait, reads go
# on) and with LOCK=NONE: shows that the writer sees a lock when there is one.
control=()
if [ "$CONTROL" = 1 ]; then
    for form in "ALGORITHM=INPLACE, LOCK=SHARED" "ALGORITHM=INPLACE, LOCK=NONE"; do
        read -r dur stall p99 n base < <(measured \
            "ALTER TABLE tb_order ADD KEY idx_control (user_id, status), $form" tb_order)
        log "control: ADD KEY on tb_order with $form: ${dur} s, longest write ${stall} s"
        control+=("$form|$dur|$stall|$p99")
        sql -e "ALTER TABLE tb_order DROP KEY idx_control"
    done
fi

# --- the table ----------------------------------------------------------------
echo
echo "$(date) — MariaDB $(sql -e 'SELECT VERSION()'), $(nproc) cores, buffer pool $BUFFER_POOL;"
echo "tb_product $PRODUCTS, tb_order $ORDERS, tb_event $EVENTS, tb_sale_second $SALE_SECONDS rows (filled once, migrations applied in order)"
echo
echo "| migration | table written (rows) | statement kind | duration | longest write stall | write p99 | online form possible (tried on a twin) |"
echo "|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do
    IFS='|' read -r name table kind size dur stall p99 form <<<"$r"
    printf '| %s | %s (%s) | %s | %s s | %s s | %s s | %s |\n' "$name" "$table" "$size" "$kind" "$dur" "$stall" "$p99" "$form"
done
if [ ${#online[@]} -gt 0 ]; then
    echo
    echo "| stalled > $STALL_LIMIT s, again online | table | form | duration | longest write stall | write p99 |"
    echo "|---|---|---|---|---|---|"
    for r in "${online[@]}"; do
        IFS='|' read -r name table form dur stall p99 <<<"$r"
        printf '| %s | %s | %s | %s s | %s s | %s s |\n' "$name" "$table" "$form" "$dur" "$stall" "$p99"
    done
fi
if [ ${#control[@]} -gt 0 ]; then
    echo
    echo "| control: ADD KEY (user_id, status) on tb_order | duration | longest write stall | write p99 |"
    echo "|---|---|---|---|"
    for r in "${control[@]}"; do
        IFS='|' read -r form dur stall p99 <<<"$r"
        printf '| %s | %s s | %s s | %s s |\n' "$form" "$dur" "$stall" "$p99"
    done
fi
