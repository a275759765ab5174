//! The commit this binary is built from, for `flashsale --version` and the
//! `flashsale_build_info` gauge (`domain::release`): `FLASHSALE_COMMIT` when
//! set (a build without `.git`, as a container image's), else
//! `git rev-parse HEAD`, else `unknown`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=FLASHSALE_COMMIT");
    // A new commit (the ref HEAD names, or HEAD itself when detached).
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/packed-refs");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD")
        && let Some(branch) = head.trim().strip_prefix("ref: ")
    {
        println!("cargo:rerun-if-changed=.git/{branch}");
    }
    let commit = std::env::var("FLASHSALE_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()
                .filter(|o| o.status.success())?;
            Some(String::from_utf8(out.stdout).ok()?.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FLASHSALE_COMMIT={commit}");
}
