//! A replicated MariaDB of the test's own, on loopback ports of its own
//! (never the shared 3306): a primary and a replica with GTID replication,
//! semi-synchronous (`AFTER_SYNC`: a commit is answered only once the
//! replica has it in its relay log) or asynchronous; killed with -9,
//! promoted and re-pointed as a failover would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

/// One `mariadbd` on a data directory of its own; killed when dropped.
pub struct OwnMariadb {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl OwnMariadb {
    /// `mysql://root@127.0.0.1:<port>`.
    pub fn server(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    /// `host:port`, for the proxy.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// kill -9: a crash, nothing flushed beyond what it committed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn connect(&self) -> MySqlConnection {
        MySqlConnection::connect(&self.server())
            .await
            .expect("the test's mariadb answers")
    }

    /// Runs `sql` (no result wanted).
    pub async fn exec(&self, sql: &str) {
        let mut c = self.connect().await;
        sqlx::raw_sql(sql)
            .execute(&mut c)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

impl Drop for OwnMariadb {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A fresh data directory, made once per rig and copied for each server
/// (`mariadb-install-db` takes seconds; a copy, milliseconds).
fn install(dir: &Path) -> PathBuf {
    let data = dir.join("template");
    let out = Command::new("mariadb-install-db")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args([
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M",
        ])
        .output()
        .expect("mariadb-install-db runs");
    assert!(
        out.status.success(),
        "mariadb-install-db failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

/// Starts `mariadbd` as server `id` on a copy of `template`.
async fn start(dir: &Path, template: &Path, id: u32) -> OwnMariadb {
    let own = dir.join(format!("node{id}"));
    let copied = Command::new("cp")
        .arg("-a")
        .arg(template)
        .arg(&own)
        .status()
        .expect("cp runs");
    assert!(copied.success(), "copy of the data directory");
    let port = free_port();
    let log = std::fs::File::create(dir.join(format!("node{id}.log"))).expect("a log file");
    let child = Command::new("/usr/sbin/mariadbd")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", own.display()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--socket={}/node{id}.sock", dir.display()))
        .arg(format!("--pid-file={}/node{id}.pid", dir.display()))
        .arg(format!("--tmpdir={}", dir.display()))
        .args([
            "--user=root",
            "--skip-name-resolve",
            "--max-connections=200",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M",
            // Replication: GTIDs, every change in the binary log (a replica
            // logs what it applies, so it can be promoted), rows as they are.
            "--log-bin=binlog",
            "--log-slave-updates=1",
            "--binlog-format=ROW",
            "--gtid-strict-mode=1",
            "--sync-binlog=1",
            "--innodb-flush-log-at-trx-commit=1",
            // Semi-sync on both sides: a primary waits for one replica's
            // receipt after its binary log is synced, before the commit is
            // visible or answered (AFTER_SYNC: nothing a client saw can be
            // lost with the primary); turned off per rig for asynchronous.
            "--rpl-semi-sync-master-wait-point=AFTER_SYNC",
            "--rpl-semi-sync-master-timeout=10000",
            "--rpl-semi-sync-slave-enabled=1",
        ])
        .arg(format!("--server-id={id}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("mariadbd starts");
    let node = OwnMariadb {
        port,
        child: Some(child),
        dir: own,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if MySqlConnection::connect(&node.server()).await.is_ok() {
            return node;
        }
        assert!(
            Instant::now() < deadline,
            "the test's mariadb {id} does not answer: {}",
            std::fs::read_to_string(dir.join(format!("node{id}.log"))).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A primary and its replica.
pub struct ReplicaPair {
    pub primary: OwnMariadb,
    pub replica: OwnMariadb,
    dir: PathBuf,
}

impl ReplicaPair {
    /// Both servers up, the replica following the primary by GTID;
    /// `semi_sync`: the primary waits for the replica's receipt of each
    /// commit (else asynchronous).
    pub async fn start(semi_sync: bool) -> ReplicaPair {
        let dir = std::env::temp_dir().join(crate::helpers::unique("fs-replicas-"));
        std::fs::create_dir_all(&dir).expect("a directory of its own");
        let template = install(&dir);
        let primary = start(&dir, &template, 1).await;
        let replica = start(&dir, &template, 2).await;
        let on = u8::from(semi_sync);
        primary
            .exec(&format!("SET GLOBAL rpl_semi_sync_master_enabled = {on}"))
            .await;
        replica
            .exec(&format!(
                "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, \
                 MASTER_USER = 'root', MASTER_USE_GTID = slave_pos, \
                 MASTER_CONNECT_RETRY = 1; START SLAVE",
                primary.port
            ))
            .await;
        let pair = ReplicaPair {
            primary,
            replica,
            dir,
        };
        if semi_sync {
            pair.wait_semi_sync().await;
        }
        pair
    }

    /// Until the primary counts the replica as its semi-sync client.
    async fn wait_semi_sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut c = self.primary.connect().await;
            let status: Option<(String, String)> =
                sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_status'")
                    .fetch_optional(&mut c)
                    .await
                    .expect("status");
            if status.is_some_and(|(_, v)| v == "ON") {
                return;
            }
            assert!(Instant::now() < deadline, "semi-sync never came on");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Holds the replica back (its I/O thread stopped): what the primary
    /// commits meanwhile is on the primary alone (asynchronous only).
    pub async fn hold_replica(&self) {
        self.replica.exec("STOP SLAVE IO_THREAD").await;
    }

    /// The old primary gone: the replica applies what it received, stops
    /// following and takes writes. What it never received is lost.
    pub async fn promote(&mut self) {
        self.primary.kill();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut c = self.replica.connect().await;
            if relay_applied(&mut c).await {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica never applied its relay log"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.replica
            .exec("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
            .await;
    }
}

/// True once the replica's SQL thread has applied everything its I/O
/// thread received.
async fn relay_applied(c: &mut MySqlConnection) -> bool {
    use sqlx::Row;
    let Ok(Some(row)) = sqlx::query("SHOW SLAVE STATUS")
        .fetch_optional(&mut *c)
        .await
    else {
        return true;
    };
    let state: String = row.try_get("Slave_SQL_Running_State").unwrap_or_default();
    state.starts_with("Slave has read all relay log")
}

impl Drop for ReplicaPair {
    fn drop(&mut self) {
        self.primary.kill();
        self.replica.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
