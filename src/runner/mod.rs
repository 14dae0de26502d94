//! The runner: the Job's entry point (book: inside-the-job.md).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The init container's step: copy this very binary to `dest` (on the shared
/// `runner` volume), executable, so that any role image can run it.
pub fn copy_self(dest: &Path) -> io::Result<()> {
    let me = std::env::current_exe()?;
    // Write under a temporary name first: a half-copied runner must never be
    // found at `dest` by the main container.
    let tmp = dest.with_extension("partial");
    fs::copy(&me, &tmp)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
    fs::rename(&tmp, dest)
}
