-- The admin log (`store::AdminLog`): every admin action through any door
-- (the admin API, the dashboard, the command line) and every failed admin
-- authentication: when, what, which sale, what was asked, the values
-- before and after, who (the credential's fingerprint or the dashboard
-- session, never a secret) and from which address. Kept after sales
-- retire.
CREATE TABLE IF NOT EXISTS tb_admin_log (
    id            BIGINT        NOT NULL AUTO_INCREMENT,
    at            BIGINT        NOT NULL,
    action        VARCHAR(64)   NOT NULL,
    product_id    VARCHAR(128)  NULL,
    actor         VARCHAR(128)  NOT NULL,
    address       VARCHAR(64)   NULL,
    status        SMALLINT      NOT NULL,
    asked         MEDIUMTEXT    NULL,
    before_value  MEDIUMTEXT    NULL,
    after_value   MEDIUMTEXT    NULL,
    PRIMARY KEY (id),
    KEY idx_product (product_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Dashboard sessions ended by a logout before their expiry, so that every
-- instance refuses a copied cookie; a row is kept until the session would
-- have expired.
CREATE TABLE IF NOT EXISTS tb_dashboard_session_ended (
    nonce    CHAR(32)  NOT NULL,
    expires  BIGINT    NOT NULL,
    PRIMARY KEY (nonce),
    KEY idx_expires (expires)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
