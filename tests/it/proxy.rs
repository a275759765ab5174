//! A TCP forwarder that a test can switch off, standing in for an outage of
//! the server behind it: while off it refuses new connections and cuts the
//! ones it carries.

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    on: watch::Sender<bool>,
}

impl Proxy {
    pub async fn start(target: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (on, watch) = watch::channel(true);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut watch = watch.clone();
                if !*watch.borrow() {
                    continue; // dropped: connection refused, in effect
                }
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = watch.wait_for(|on| !*on) => {}
                    }
                });
            }
        });
        Proxy { port, on }
    }

    pub fn set_on(&self, on: bool) {
        self.on.send_replace(on);
    }
}
