//! The live state of the generation serving now: its configuration, what user code may
//! import, what the tool descriptions say and which generation it is. A rollover swaps it
//! whole, so a request reads one consistent generation from start to end.

use std::sync::{Arc, RwLock};

use crate::config::Config;
use crate::generation::GenerationInfo;
use crate::generation::stamp::EnvStamp;
use crate::packages::Packages;
use crate::tools::ToolContext;

/// One generation's view, as handlers read it.
#[derive(Debug)]
pub struct Live {
    pub config: Arc<Config>,
    pub packages: Arc<Packages>,
    /// The tool descriptions' context, without host tools: a caller's are added for it
    /// (`crate::api::AppState::tool_context_for`).
    pub tool_context: Arc<ToolContext>,
    pub generation: GenerationInfo,
    /// The files of its environment when it started (`None`: unreadable), against which a
    /// rollover tells whether anything changed.
    pub environment: Option<EnvStamp>,
}

/// The swappable cell holding the current [`Live`].
#[derive(Debug)]
pub struct LiveCell(RwLock<Arc<Live>>);

impl LiveCell {
    pub fn new(live: Live) -> Self {
        Self(RwLock::new(Arc::new(live)))
    }

    /// The current generation's view (cheap: one `Arc` clone under a read lock).
    pub fn load(&self) -> Arc<Live> {
        self.0.read().expect("live lock").clone()
    }

    /// Makes `live` current for every request that starts from now on.
    pub fn store(&self, live: Live) {
        *self.0.write().expect("live lock") = Arc::new(live);
    }
}
