#!/bin/bash
# What MariaDB spends per `tb_order` row, by index set, and per PREPARE of a
# batch INSERT: the measurements behind BENCHMARKS.md "The MySQL
# bound per row". Needs the local MariaDB (root, no password; its process is
# measured from /proc) and the `flashsale` database migrated (run `serve`
# once). Works in a scratch database `order_table_cost`, dropped at the end.
#
#   scripts/order-table-cost.sh [rounds]
#   VARIANTS="as-is ascii-bin-ids" scripts/order-table-cost.sh 3   # some of the twins
set -euo pipefail
rounds=${1:-2}
pid=$(pgrep -x mariadbd || pgrep -x mysqld)
db=order_table_cost
work=$(mktemp -d)
trap 'rm -rf "$work"; mariadb -uroot -e "DROP DATABASE IF EXISTS $db"' EXIT
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; } # user + system, 10 ms ticks

# 50,000 rows as the workers write them: 100 transactions of one 500-row
# INSERT and the product's UPDATE.
python3 - "$work" <<'PY'
import random, sys, time
random.seed(1)
ms = int(time.time() * 1000)
rows = []
for i in range(50000):
    m = ms + i // 50
    rows.append(f"('cost-sku:{m:012x}{random.getrandbits(96):024x}',{random.randint(1, 10**9)},"
                f"'cost-sku',1,4999.00,'confirmed',{m},{m},NULL)")
with open(f"{sys.argv[1]}/insert.sql", "w") as f:
    for b in range(0, 50000, 500):
        f.write("BEGIN;\nINSERT INTO T (order_id,user_id,product_id,quantity,price,status,created,"
                "updated,idempotency_key) VALUES " + ",".join(rows[b:b + 500]) + ";\n"
                "UPDATE tb_product SET updated = updated WHERE product_id = 'cost-sku';\nCOMMIT;\n")
with open(f"{sys.argv[1]}/prepare.sql", "w") as f:
    for i in range(200):
        values = ",".join(["(?,?,?,?,?,?,?,?,?)"] * (500 - i))
        f.write(f"PREPARE s{i} FROM 'INSERT INTO T (order_id,user_id,product_id,quantity,price,"
                f"status,created,updated,idempotency_key) VALUES {values}';\nDEALLOCATE PREPARE s{i};\n")
PY
mariadb -uroot -e "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db"
mariadb -uroot $db -e "CREATE TABLE tb_product LIKE flashsale.tb_product;
  INSERT INTO tb_product (product_id, price, available_qty, title, start_time, end_time, created, updated)
  VALUES ('cost-sku', 1, 1, 't', 0, 0, 0, 0)"

# The twin of tb_order as it is now, and variants of it.
declare -A variants=(
  [as-is]=""
  [two-status-indexes]="ALTER TABLE T DROP KEY idx_status_released_created, ADD KEY idx_status_created (status, created), ADD KEY idx_status_released (status, released);"
  [no-status-index]="ALTER TABLE T DROP KEY idx_status_released_created;"
  [pk-and-order-id-only]="ALTER TABLE T DROP KEY idx_status_released_created, DROP KEY idx_user, DROP KEY idx_product_status;"
  [decimal-19-4]="ALTER TABLE T MODIFY price DECIMAL(19,4) NOT NULL;"
  [ascii-bin-ids]="ALTER TABLE T MODIFY order_id VARCHAR(191) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, MODIFY product_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL;"
  [ascii-bin-ids-status]="ALTER TABLE T MODIFY order_id VARCHAR(191) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, MODIFY product_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, MODIFY status VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL;"
  [order-id-pk]="ALTER TABLE T DROP COLUMN id, DROP KEY uk_order_id, ADD PRIMARY KEY (order_id);"
  [order-id-pk-ascii-bin]="ALTER TABLE T DROP COLUMN id, DROP KEY uk_order_id, MODIFY order_id VARCHAR(191) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, MODIFY product_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, ADD PRIMARY KEY (order_id);"
)
for round in $(seq 1 "$rounds"); do
  for name in ${VARIANTS:-as-is two-status-indexes no-status-index pk-and-order-id-only decimal-19-4 ascii-bin-ids ascii-bin-ids-status order-id-pk order-id-pk-ascii-bin}; do
    mariadb -uroot $db -e "DROP TABLE IF EXISTS T; CREATE TABLE T LIKE flashsale.tb_order; ${variants[$name]}"
    sleep 0.5
    before=$(cpu)
    mariadb -uroot $db < "$work/insert.sql"
    ticks=$(($(cpu) - before))
    echo "round $round  $name: $ticks ticks for 50,000 rows, $((ticks * 10000 / 50000)).$(( (ticks * 100000 / 50000) % 10 )) µs per row"
  done
done
mariadb -uroot $db -e "DROP TABLE IF EXISTS T; CREATE TABLE T LIKE flashsale.tb_order"
before=$(cpu)
mariadb -uroot $db < "$work/prepare.sql"
ticks=$(($(cpu) - before))
echo "200 PREPAREs of 301-500-row INSERTs: $ticks ticks, $((ticks * 10000 / 200)) µs each"
