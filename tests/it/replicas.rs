//! A replicated MariaDB of the test's own, on loopback ports of its own
//! (never the shared 3306): a primary and a replica with GTID replication,
//! semi-synchronous (`AFTER_SYNC`: a commit is answered only once the
//! replica has it in its relay log) or asynchronous; killed with -9,
//! promoted and re-pointed as a failover would.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

use crate::helpers::{eventually, poll_for};

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

/// Starts `mariadbd` as server `id` of a replication pair on a copy of
/// `template`.
async fn start(dir: &Path, template: &Path, id: u32) -> OwnMariadb {
    let args: Vec<String> = [
        // Replication: GTIDs, every change in the binary log (a replica
        // logs what it applies, so it can be promoted), rows as they are.
        "--log-bin=binlog",
        "--log-slave-updates=1",
        "--binlog-format=ROW",
        "--gtid-strict-mode=1",
        "--sync-binlog=1",
        // Semi-sync on both sides: a primary waits for one replica's
        // receipt after its binary log is synced, before the commit is
        // visible or answered (AFTER_SYNC: nothing a client saw can be
        // lost with the primary); turned off per rig for asynchronous.
        "--rpl-semi-sync-master-wait-point=AFTER_SYNC",
        "--rpl-semi-sync-master-timeout=10000",
        "--rpl-semi-sync-slave-enabled=1",
    ]
    .map(str::to_owned)
    .to_vec();
    launch(dir, Some(template), id, free_port(), &args).await
}

/// Starts `mariadbd` as server `id` on a copy of `template`, listening on
/// `port`, with `args` beside the common ones.
/// `template`: `None` for an empty data directory, which a Galera joiner's
/// state transfer fills (its rsync daemon runs as nobody, and cannot
/// change files that root's copy left).
async fn launch(
    dir: &Path,
    template: Option<&Path>,
    id: u32,
    port: u16,
    args: &[String],
) -> OwnMariadb {
    let own = dir.join(format!("node{id}"));
    match template {
        Some(template) => {
            let copied = Command::new("cp")
                .arg("-a")
                .arg(template)
                .arg(&own)
                .status()
                .expect("cp runs");
            assert!(copied.success(), "copy of the data directory");
        }
        None => std::fs::create_dir_all(&own).expect("an empty data directory"),
    }
    let chmod = Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(&own)
        .status()
        .expect("chmod runs");
    assert!(chmod.success(), "the data directory opened");
    let log = std::fs::File::create(dir.join(format!("node{id}.log"))).expect("a log file");
    let mut child = Command::new("/usr/sbin/mariadbd");
    child
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
            "--innodb-flush-log-at-trx-commit=1",
        ])
        .args(args)
        .arg(format!("--server-id={id}"))
        .stdout(Stdio::null())
        .stderr(log);
    // Killed with the test's thread too, should the test process die
    // before its Drop runs (an exit, an abort).
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        child.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = child.spawn().expect("mariadbd starts");
    let node = OwnMariadb {
        port,
        child: Some(child),
        dir: own,
    };
    let answers = poll_for(Duration::from_secs(30), || async {
        MySqlConnection::connect(&node.server())
            .await
            .ok()
            .map(drop)
    })
    .await;
    assert!(
        answers.is_some(),
        "the test's mariadb {id} does not answer: {}",
        std::fs::read_to_string(dir.join(format!("node{id}.log"))).unwrap_or_default()
    );
    node
}

/// A three-node Galera cluster (`galera-4`), every node a writer.
pub struct Galera {
    pub nodes: Vec<OwnMariadb>,
    dir: PathBuf,
}

impl Galera {
    /// Three nodes synced: the first bootstraps the cluster, the others
    /// join it by a state transfer (rsync).
    pub async fn start() -> Galera {
        let dir = std::env::temp_dir().join(crate::helpers::unique("fs-galera-"));
        std::fs::create_dir_all(&dir).expect("a directory of its own");
        // The joiners' rsync daemon runs as nobody: it must reach the data.
        chmod_open(&dir);
        let template = install(&dir);
        let ports: Vec<[u16; 4]> = (0..3)
            .map(|_| [free_port(), free_port(), free_port(), free_port()])
            .collect();
        let cluster = ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p[1]))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (i, [port, gcomm, sst, ist]) in ports.iter().copied().enumerate() {
            let id = i as u32 + 1;
            let mut args = vec![
                "--binlog-format=ROW".to_owned(),
                "--innodb-autoinc-lock-mode=2".to_owned(),
                "--wsrep-on=ON".to_owned(),
                "--wsrep-provider=/usr/lib/galera/libgalera_smm.so".to_owned(),
                format!("--wsrep-cluster-address=gcomm://{cluster}"),
                "--wsrep-cluster-name=flashsale-test".to_owned(),
                format!("--wsrep-node-address=127.0.0.1:{gcomm}"),
                format!("--wsrep-node-name=n{id}"),
                format!(
                    "--wsrep-provider-options=base_port={gcomm};ist.recv_addr=127.0.0.1:{ist};gcache.size=32M"
                ),
                format!("--wsrep-sst-receive-address=127.0.0.1:{sst}"),
                "--wsrep-sst-method=rsync".to_owned(),
            ];
            if id == 1 {
                args.push("--wsrep-new-cluster".to_owned());
            }
            let data = (id == 1).then_some(template.as_path());
            nodes.push(launch(&dir, data, id, port, &args).await);
        }
        let galera = Galera { nodes, dir };
        galera.wait_synced(3).await;
        galera
    }

    /// Until every live node counts `size` synced members.
    pub async fn wait_synced(&self, size: u32) {
        eventually("the cluster synced", Duration::from_secs(60), || async {
            for node in self.nodes.iter().filter(|n| n.child.is_some()) {
                let Ok(mut c) = MySqlConnection::connect(&node.server()).await else {
                    return false;
                };
                let status: Vec<(String, String)> = sqlx::query_as(
                    "SHOW STATUS WHERE Variable_name IN ('wsrep_cluster_size', 'wsrep_local_state_comment')",
                )
                .fetch_all(&mut c)
                .await
                .unwrap_or_default();
                let value = |name: &str| {
                    status
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                if value("wsrep_cluster_size") != size.to_string()
                    || value("wsrep_local_state_comment") != "Synced"
                {
                    return false;
                }
            }
            true
        })
        .await;
    }
}

impl Drop for Galera {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn chmod_open(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
}

/// One server of the test's own, with nobody replicating: for what the
/// shared one must never do (`read_only`, a kill).
pub struct Single {
    pub server: OwnMariadb,
    dir: PathBuf,
}

impl Single {
    pub async fn start() -> Single {
        let dir = std::env::temp_dir().join(crate::helpers::unique("fs-single-"));
        std::fs::create_dir_all(&dir).expect("a directory of its own");
        let template = install(&dir);
        let server = launch(&dir, Some(&template), 1, free_port(), &[]).await;
        Single { server, dir }
    }
}

impl Drop for Single {
    fn drop(&mut self) {
        self.server.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
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
        eventually("semi-sync on", Duration::from_secs(20), || async {
            let mut c = self.primary.connect().await;
            let status: Option<(String, String)> =
                sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_status'")
                    .fetch_optional(&mut c)
                    .await
                    .expect("status");
            status.is_some_and(|(_, v)| v == "ON")
        })
        .await;
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
        eventually(
            "the replica applied its relay log",
            Duration::from_secs(30),
            || async { relay_applied(&mut self.replica.connect().await).await },
        )
        .await;
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
