//! A TCP forwarder standing in for the server behind it, which a test can
//! switch between forwarding, an outage (refuses new connections and cuts the
//! ones it carries), a stall (accepts and holds connections, answers nothing)
//! and slowness (forwards each chunk after a delay).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Off,
    /// Connections are held open and never answered; they are cut when the
    /// mode changes, as a hung server's would be when it is restarted.
    Stall,
    /// Every chunk is forwarded after this delay.
    Slow(Duration),
}

pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    target: watch::Sender<String>,
}

impl Proxy {
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (mode, watch) = watch::channel(Mode::Forward);
        let (target, targets) = watch::channel(target.to_owned());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watch = watch.clone();
                let now = *watch.borrow();
                match now {
                    Mode::Off => continue, // dropped: connection refused, in effect
                    Mode::Stall => {
                        tokio::spawn(hold(client, watch));
                    }
                    Mode::Forward | Mode::Slow(_) => {
                        let to = targets.borrow().clone();
                        tokio::spawn(forward(client, to, watch));
                    }
                }
            }
        });
        Proxy { port, mode, target }
    }

    /// Sends new connections to `target` from now on, cutting the ones it
    /// carries: a failover's switch of the address clients reach.
    pub async fn repoint(&self, target: &str) {
        let mode = *self.mode.borrow();
        self.set_mode(Mode::Off);
        // Long enough for every forwarding task to see the outage.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.target.send_replace(target.to_owned());
        self.set_mode(mode);
    }

    /// On: forward; off: an outage.
    pub fn set_on(&self, on: bool) {
        self.set_mode(if on { Mode::Forward } else { Mode::Off });
    }

    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

/// Keeps `client` open, unanswered, while the proxy stalls.
async fn hold(client: TcpStream, mut watch: watch::Receiver<Mode>) {
    let _ = watch.wait_for(|m| *m != Mode::Stall).await;
    drop(client);
}

async fn forward(mut client: TcpStream, target: String, mut watch: watch::Receiver<Mode>) {
    let Ok(mut server) = TcpStream::connect(target.as_str()).await else {
        return;
    };
    {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        let outage = |m: &Mode| matches!(m, Mode::Off | Mode::Stall);
        let (up, down) = (watch.clone(), watch.clone());
        tokio::select! {
            _ = copy(&mut cr, &mut sw, up) => return,
            _ = copy(&mut sr, &mut cw, down) => return,
            _ = watch.wait_for(outage) => {}
        }
    }
    // A stall holds the connection, unanswered, until it ends; an outage cuts it.
    let _ = watch.wait_for(|m| *m != Mode::Stall).await;
}

/// Copies `from` to `to`, each chunk late while the proxy is slow.
async fn copy(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let delay = match *mode.borrow() {
                    Mode::Slow(d) => Some(d),
                    _ => None,
                };
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
