// embed_migrations! does not track the folder; without this a new migration would not
// be picked up by an incremental build.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
