//! The image calls of the CRI: the store's, and what the engine keeps of its own beside it
//! (Apptainer's SIFs).

use super::{Result, Runtime};
use crate::images::{Credentials, ImageRecord};

impl Runtime {
    /// Whether the engine works (CRI `RuntimeReady`): the runtime's directories (root and
    /// state) take a file, and the engine runs. `Err` says why not. Runs processes: call it
    /// off the async threads.
    pub fn engine_ready(&self) -> std::result::Result<(), String> {
        for dir in [&self.config.root, &self.config.state] {
            let probe = dir.join(".ready-probe");
            std::fs::write(&probe, b"")
                .map_err(|e| format!("the runtime's directory {} takes no file: {e}", dir.display()))?;
            let _ = std::fs::remove_file(&probe);
        }
        let name = self.engine_name();
        self.engine.ready().map_err(|e| format!("{name} does not run: {e}"))
    }

    /// The engine's name: `crun` or `apptainer`.
    pub fn engine_name(&self) -> &'static str {
        self.engine.kind().name()
    }

    /// Pulls an image into the store, and what the engine keeps of it.
    pub async fn pull_image(&self, reference: &str, auth: Option<Credentials>) -> Result<ImageRecord> {
        self.engine.check_pull(auth.as_ref())?;
        let record = self.images.pull(reference, auth.clone()).await?;
        self.engine.pulled(reference, &record, auth.as_ref()).await?;
        Ok(record)
    }

    /// The image `wanted` names, if present for this engine.
    pub fn image_status(&self, wanted: &str) -> Option<ImageRecord> {
        self.images.status(wanted).filter(|image| self.engine.has_image(image))
    }

    /// The images present for this engine.
    pub fn list_images(&self) -> Vec<ImageRecord> {
        self.images.list().into_iter().filter(|image| self.engine.has_image(image)).collect()
    }

    /// Removes an image, and what the engine keeps of it once the store has no record of it.
    pub async fn remove_image(&self, wanted: &str) -> Result<()> {
        let before = self.images.status(wanted);
        self.images.remove(wanted).await?;
        if let Some(image) = before
            && self.images.status(&image.id).is_none()
        {
            self.engine.image_removed(&image)?;
        }
        Ok(())
    }
}
