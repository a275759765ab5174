-- Events pushed to the shop's endpoint (EVENT_WEBHOOK_URL), in id order:
-- one row per endpoint holds how far delivery got, who delivers now (a
-- lease: several worker processes never deliver at once) and the current
-- event's attempts. An event that exhausts its attempts goes to
-- tb_event_dead (delivery moves on); an operator replays it from there.
CREATE TABLE IF NOT EXISTS tb_event_delivery (
    endpoint        VARCHAR(191)  NOT NULL PRIMARY KEY,
    delivered_up_to BIGINT        NOT NULL DEFAULT 0,
    lease_owner     VARCHAR(191)  NULL,
    lease_until     BIGINT        NOT NULL DEFAULT 0,
    attempts        INT           NOT NULL DEFAULT 0,
    next_attempt    BIGINT        NOT NULL DEFAULT 0,
    last_error      VARCHAR(512)  NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS tb_event_dead (
    endpoint    VARCHAR(191)  NOT NULL,
    event_id    BIGINT        NOT NULL,
    attempts    INT           NOT NULL,
    last_error  VARCHAR(512)  NULL,
    dead_at     BIGINT        NOT NULL,
    replay      TINYINT       NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, event_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
