//! Writes each fuzz target's seed inputs to `fuzz/corpus/<target>/seed-<n>` (run from anywhere:
//! the path is the workspace's).

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for (target, seeds) in fuzzing::seeds::all() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed)?;
        }
        println!("{}: {} seeds", dir.display(), seeds.len());
    }
    Ok(())
}
