//! Images: checked against their signatures before anything else (when the control plane's
//! image rules name their project), pulled by digest (with the registry's credentials when
//! configured), remembered as this agent's, and collected when nothing of ours uses them.

use super::*;

impl Engine {
    pub(super) fn pulled_images(&self) -> Vec<String> {
        std::fs::read_to_string(&self.pulled)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Reads, changes and rewrites the list of pulled images, as one step.
    pub(super) fn edit_pulled(&self, change: impl FnOnce(&mut Vec<String>)) -> Result<(), Failure> {
        let _held = self
            .pulled_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut images = self.pulled_images();
        let before = images.clone();
        change(&mut images);
        if images == before {
            return Ok(());
        }
        self.set_pulled(&images)
    }

    pub(super) fn set_pulled(&self, images: &[String]) -> Result<(), Failure> {
        if let Some(dir) = self.pulled.parent() {
            std::fs::create_dir_all(dir).map_err(|e| retryable("state-write-failed", e.to_string()))?;
        }
        let tmp = self.pulled.with_extension("new");
        let mut text = images.join("\n");
        text.push('\n');
        std::fs::write(&tmp, text).map_err(|e| retryable("state-write-failed", e.to_string()))?;
        std::fs::rename(&tmp, &self.pulled).map_err(|e| retryable("state-write-failed", e.to_string()))
    }

    /// Disk: removes the images this agent pulled that no container (of anyone) has used for
    /// the grace ([`super::UNUSED_IMAGE_GRACE`]). An image it did not pull is never touched.
    /// Returns the images removed.
    pub async fn collect_images(&self) -> Result<Vec<String>, Failure> {
        let pulled = self.pulled_images();
        if pulled.is_empty() {
            return Ok(Vec::new());
        }
        let containers = self
            .docker
            .list_containers(Some(ListContainersOptionsBuilder::default().all(true).build()))
            .await
            .map_err(|e| docker("docker-unavailable", e))?;
        let in_use: std::collections::HashSet<String> = containers.into_iter().filter_map(|c| c.image_id).collect();
        let (mut forgotten, mut removed) = (Vec::new(), Vec::new());
        for image in pulled {
            let id = match self.docker.inspect_image(&image).await {
                Ok(i) => i.id.unwrap_or_default(),
                Err(e) if not_found(&e) => {
                    forgotten.push(image); // gone already: forget it
                    continue;
                }
                Err(e) => return Err(docker("docker-unavailable", e)),
            };
            if in_use.contains(&id) {
                if let Ok(mut u) = self.unused_since.lock() {
                    u.remove(&image);
                }
                continue;
            }
            let since = self
                .unused_since
                .lock()
                .map(|mut u| *u.entry(image.clone()).or_insert_with(std::time::Instant::now))
                .unwrap_or_else(|_| std::time::Instant::now());
            if since.elapsed() < self.unused_image_grace {
                continue;
            }
            match self
                .docker
                .remove_image(&image, None::<bollard::query_parameters::RemoveImageOptions>, None)
                .await
            {
                Ok(_) => {
                    if let Ok(mut u) = self.unused_since.lock() {
                        u.remove(&image);
                    }
                    removed.push(image)
                }
                Err(e) if not_found(&e) => forgotten.push(image),
                Err(_) => {} // in use after all (a race): next round
            }
        }
        // What was pulled meanwhile stays listed.
        self.edit_pulled(|list| list.retain(|i| !removed.contains(i) && !forgotten.contains(i)))?;
        Ok(removed)
    }

    /// Pulls `image` (by digest) when the engine does not have it, and returns the reference
    /// the engine knows it by: `image` itself, or for one of the control plane's store
    /// (`pushleft.invalid/…`) the agent's loopback endpoint's (`image_proxy`), pulled with its
    /// credentials. A registry that cannot resolve fails at once, for good, with a hint (a pull
    /// would fail the same way on every retry); one under `.invalid` (a placeholder) is
    /// refused without asking a resolver.
    pub(super) async fn ensure_image(&self, image: &str) -> Result<String, Failure> {
        if agent_proto::images::in_store(image).is_some() {
            return self.ensure_stored_image(image).await;
        }
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(image.to_owned()),
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(docker("docker-unavailable", e)),
        }
        let unreachable = |registry: &str, why: &str| {
            permanent(
                "image-registry-unreachable",
                format!(
                    "{image}: the registry {registry} {why}; push the image to a registry this node resolves, or build it on this machine (`pl up --build PROJECT=DIR`)"
                ),
            )
        };
        if let Some(registry) = crate::registry_auth::registry_of(image)
            && registry
                .split(':')
                .next()
                .is_some_and(|h| h == "invalid" || h.ends_with(".invalid"))
        {
            return Err(unreachable(
                registry,
                "is a placeholder under .invalid, which never resolves",
            ));
        }
        let credentials =
            match crate::registry_auth::registry_of(image).and_then(|r| Some((r, self.registry_auth.get(r)?))) {
                Some((registry, file)) => Some(
                    crate::registry_auth::read(file, registry).map_err(|e| permanent("registry-auth-unreadable", e))?,
                ),
                None => None,
            };
        self.pull(image, credentials).await?;
        Ok(image.to_owned())
    }

    /// An image of the control plane's store, through this agent's loopback endpoint.
    async fn ensure_stored_image(&self, image: &str) -> Result<String, Failure> {
        let Some(proxy) = &self.store_proxy else {
            return Err(permanent(
                "image-store-unavailable",
                format!(
                    "{image}: this agent serves no image store to its engine (it runs without a control plane connection)"
                ),
            ));
        };
        let local = proxy.local_reference(image).ok_or_else(|| {
            permanent(
                "image-not-found",
                format!("{image}: not a digest reference to the store"),
            )
        })?;
        match self.docker.inspect_image(&local).await {
            Ok(_) => return Ok(local),
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(docker("docker-unavailable", e)),
        }
        let credentials = bollard::auth::DockerCredentials {
            username: Some(proxy.username.clone()),
            password: Some(proxy.password.as_str().to_owned()),
            serveraddress: Some(proxy.server()),
            ..Default::default()
        };
        self.pull(&local, Some(credentials)).await?;
        Ok(local)
    }

    async fn pull(&self, image: &str, credentials: Option<bollard::auth::DockerCredentials>) -> Result<(), Failure> {
        let unreachable = |registry: &str, why: &str| {
            permanent(
                "image-registry-unreachable",
                format!(
                    "{image}: the registry {registry} {why}; push the image to a registry this node resolves, or build it on this machine (`pl up --build PROJECT=DIR`)"
                ),
            )
        };
        let mut pull = self.docker.create_image(
            Some(CreateImageOptionsBuilder::default().from_image(image).build()),
            None,
            credentials,
        );
        // Remembered before the pull: an image this agent pulled is the only kind it removes.
        self.edit_pulled(|list| {
            if !list.iter().any(|p| p == image) {
                list.push(image.to_owned());
            }
        })?;
        while let Some(step) = pull.next().await {
            if let Err(e) = step {
                return Err(match &e {
                    DockerError::DockerResponseServerError { status_code: 404, .. } => {
                        permanent("image-not-found", format!("{image}: {e}"))
                    }
                    DockerError::DockerStreamError { error }
                        if error.contains("not found") || error.contains("manifest unknown") =>
                    {
                        permanent("image-not-found", format!("{image}: {error}"))
                    }
                    _ if resolve_failed(&e.to_string()) => unreachable(
                        crate::registry_auth::registry_of(image).unwrap_or("docker.io"),
                        "does not resolve",
                    ),
                    _ => retryable("image-pull-failed", format!("{image}: {e}")),
                });
            }
        }
        Ok(())
    }
}

/// Whether an engine's pull error says the registry's name does not exist (Go's resolver's
/// words for NXDOMAIN), which no retry mends; a resolver that failed for now is retried.
fn resolve_failed(error: &str) -> bool {
    error.contains("no such host")
}

/// Checks `app`'s image against what its `image_trust` asks, before it is pulled or run: one of
/// its signatures, over the digest it is pinned to, by one of the keys the image rules of its
/// project trust. Nothing is checked when no rule names the project (no `image_trust`).
/// A refusal is permanent: the same image fails the same way until Git or the policy changes.
pub(super) fn check_image(app: &ApplicationSpec) -> Result<Option<image_trust::Verified>, Failure> {
    let Some(trust) = &app.image_trust else {
        return Ok(None);
    };
    let Some(digest) = image_trust::digest_of(&app.image) else {
        return Err(permanent(
            "image-signature-invalid",
            format!(
                "{}: not pinned to a sha256 digest, so no signature can name it",
                app.image
            ),
        ));
    };
    let keys: Vec<image_trust::TrustedKey> = trust
        .signers
        .iter()
        .filter_map(|s| {
            Some(image_trust::TrustedKey {
                principal: s.principal.clone(),
                key: ssh_key::PublicKey::from_openssh(&s.key).ok()?,
            })
        })
        .collect();
    match image_trust::verify(&trust.signatures, digest, &keys, trust.required) {
        Ok(verified) => {
            if let Some(v) = &verified {
                tracing::info!(
                    environment = %app.environment, container = %app.container, image = %app.image,
                    signer = %v.principal, fingerprint = %v.fingerprint, "image signature verified"
                );
            }
            Ok(verified)
        }
        Err(refusal) => Err(permanent(
            refusal.code(),
            format!("{}: {refusal}; {}", app.image, refusal.hint()),
        )),
    }
}
