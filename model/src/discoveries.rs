//! What a model's exhaustive check found: the tests of the models of their own
//! (`leased_units`, `leased_slots`) ask which properties have a discovery.

use std::hash::Hash;

use stateright::{Checker, Model};

/// The names of `model`'s properties that the checker found an example of (`sometimes`) or a
/// counterexample to (`always`), in the order the model lists them; breadth first, two threads.
pub fn discovered<M>(model: M) -> Vec<&'static str>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let names: Vec<&'static str> = model.properties().iter().map(|p| p.name).collect();
    let checker = model.checker().threads(2).spawn_bfs().join();
    names
        .into_iter()
        .filter(|name| checker.discovery(name).is_some())
        .collect()
}
