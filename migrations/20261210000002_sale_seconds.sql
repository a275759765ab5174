-- A sale's timeline (`metrics::timeline`): per second, what each process
-- (`source`: a random name it draws at start) counted for the sale, its
-- readings of the waiting room and the order route's latency by bucket,
-- each a JSON object of name -> value (only what is not 0). Written with
-- its values (a write tried again counts nothing twice); the report sums
-- the sources. `tb_sale_report`: the report made at retirement, kept with
-- the final audit.
CREATE TABLE IF NOT EXISTS tb_sale_second (
    product_id  VARCHAR(128) NOT NULL,
    second      BIGINT       NOT NULL,
    source      VARCHAR(64)  NOT NULL,
    counts      TEXT         NOT NULL,
    gauges      TEXT         NOT NULL,
    latency     TEXT         NOT NULL,
    PRIMARY KEY (product_id, second, source)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS tb_sale_report (
    product_id  VARCHAR(128) NOT NULL,
    report      MEDIUMTEXT   NOT NULL,
    made        BIGINT       NOT NULL,
    PRIMARY KEY (product_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
