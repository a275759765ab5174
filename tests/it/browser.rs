//! A real browser for the tests of pages: headless Chromium driven through
//! chromedriver's WebDriver protocol (plain HTTP and JSON, so no client
//! library). Debian's `chromium` and `chromium-driver` packages provide
//! both; `.ci/run` installs them and sets `FLASHSALE_BROWSER=required`, so
//! there the test fails without them. Elsewhere (a fresh machine running
//! the README's test command) a missing browser skips the test, loudly.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::helpers::eventually;

/// The W3C WebDriver key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    base: String,
    http: reqwest::Client,
    /// chromedriver's address and the session's path, to end the session
    /// without a runtime (on drop).
    driver_addr: String,
    session_path: String,
    closed: bool,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session; `None` when
    /// they are not installed and not required.
    pub async fn start() -> Option<Self> {
        let found = |name: &str| {
            std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| dir.join(name).is_file())
            })
        };
        if !found("chromedriver") || !found("chromium") {
            let help = "apt-get install chromium chromium-driver";
            if std::env::var("FLASHSALE_BROWSER").as_deref() == Ok("required") {
                panic!("FLASHSALE_BROWSER=required and no chromium/chromedriver: {help}");
            }
            eprintln!("SKIPPED: no chromium/chromedriver for the browser test ({help})");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let http = reqwest::Client::new();
        let driver_url = format!("http://127.0.0.1:{port}");
        eventually("chromedriver ready", Duration::from_secs(30), || async {
            let ready = http.get(format!("{driver_url}/status")).send().await;
            if let Ok(r) = ready
                && let Ok(v) = r.json::<Value>().await
            {
                v["value"]["ready"] == true
            } else {
                false
            }
        })
        .await;
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900",
                         "--lang=en-US"],
            },
        }}});
        let session: Value = http
            .post(format!("{driver_url}/session"))
            .json(&caps)
            .send()
            .await
            .expect("session request")
            .json()
            .await
            .expect("session answer");
        let id = session["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {session}"));
        Some(Self {
            driver,
            base: format!("{driver_url}/session/{id}"),
            http,
            driver_addr: format!("127.0.0.1:{port}"),
            session_path: format!("/session/{id}"),
            closed: false,
        })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let answer: Value = req
            .send()
            .await
            .expect("webdriver answers")
            .json()
            .await
            .expect("webdriver JSON");
        if answer["value"]["error"].is_string() {
            panic!("webdriver {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    async fn find(&self, css: &str) -> String {
        let found = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found[ELEMENT].as_str().expect("an element").to_owned()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    pub async fn click(&self, css: &str) {
        let el = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{el}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Runs `script` (a function body) in the page and returns its result.
    pub async fn eval(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// The text of the first element matching `css` (`None`: no such element).
    pub async fn text(&self, css: &str) -> Option<String> {
        let css = serde_json::to_string(css).expect("a string");
        self.eval(&format!(
            "const el = document.querySelector({css}); return el ? el.textContent : null;"
        ))
        .await
        .as_str()
        .map(str::to_owned)
    }

    pub async fn cookies(&self) -> Vec<Value> {
        match self.call(reqwest::Method::GET, "/cookie", None).await {
            Value::Array(cookies) => cookies,
            other => panic!("cookies: {other}"),
        }
    }

    /// Resizes the window (e.g. to a phone's width).
    pub async fn set_window_size(&self, width: u32, height: u32) {
        self.call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64"))
            .expect("a PNG")
    }

    pub async fn quit(mut self) {
        let _ = self.http.delete(&self.base).send().await;
        let _ = self.driver.kill().await;
        self.closed = true;
    }
}

impl Drop for Browser {
    /// A test that fails never reaches [`Browser::quit`]: the session is
    /// ended here, so chromedriver closes Chromium (killing chromedriver
    /// alone leaves the browser running, orphaned).
    fn drop(&mut self) {
        use std::io::{Read, Write};
        if self.closed {
            return;
        }
        let Ok(mut stream) = std::net::TcpStream::connect(&self.driver_addr) else {
            return;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let request = format!(
            "DELETE {} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.session_path, self.driver_addr
        );
        if stream.write_all(request.as_bytes()).is_ok() {
            let _ = stream.read_to_end(&mut Vec::new());
        }
    }
}
