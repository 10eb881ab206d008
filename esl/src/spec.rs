//! [`ResourceSpec`]: what a scheduling library hands back to the application, to attach to
//! its tasks. Specs of several ESLs compose on one task: AND is concatenation.

use escher_client::Task;
use escher_proto::types::{Amount, ResourceName, ResourceSet, ResourceUpdate, TaskSpec};

use crate::EslError;

/// Requirements and signals one policy adds to a task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceSpec {
    /// Resources the task must hold.
    pub resources: ResourceSet,
    /// Resource changes when the task starts.
    pub on_start: Vec<ResourceUpdate>,
    /// Resource changes when the task succeeds.
    pub on_success: Vec<ResourceUpdate>,
}

impl ResourceSpec {
    /// Asks for nothing.
    pub fn new() -> ResourceSpec {
        ResourceSpec::default()
    }

    /// Also require `amount` of `name`.
    pub fn require(mut self, name: ResourceName, amount: Amount) -> Result<ResourceSpec, EslError> {
        let mut add = ResourceSet::new();
        add.insert(name, amount);
        self.resources.merge(&add)?;
        Ok(self)
    }

    /// Also apply `update` when the task starts.
    pub fn on_start(mut self, update: ResourceUpdate) -> ResourceSpec {
        self.on_start.push(update);
        self
    }

    /// Also apply `update` when the task succeeds.
    pub fn on_success(mut self, update: ResourceUpdate) -> ResourceSpec {
        self.on_success.push(update);
        self
    }

    /// AND: both specs' requirements (amounts of the same resource add up) and signals.
    pub fn and(mut self, other: &ResourceSpec) -> Result<ResourceSpec, EslError> {
        self.resources.merge(&other.resources)?;
        self.on_start.extend(other.on_start.iter().cloned());
        self.on_success.extend(other.on_success.iter().cloned());
        Ok(self)
    }

    /// Adds this spec to a task being built (requirements add up with what it already asks).
    pub fn apply(&self, mut task: Task) -> Task {
        task = task.add_resources(&self.resources);
        for update in &self.on_start {
            task = task.on_start(update.clone());
        }
        for update in &self.on_success {
            task = task.on_success(update.clone());
        }
        task
    }

    /// Adds this spec to a finished task spec.
    pub fn apply_to(&self, spec: &mut TaskSpec) -> Result<(), EslError> {
        spec.resources.merge(&self.resources)?;
        spec.on_start.extend(self.on_start.iter().cloned());
        spec.on_success.extend(self.on_success.iter().cloned());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_adds_to_what_the_task_already_requires() {
        let spec = ResourceSpec::new()
            .require(ResourceName::new("x").unwrap(), Amount::ONE)
            .unwrap();
        let task = Task::function("f", Vec::new()).resources_str("cpu=1,x=2");
        let built = spec.apply(task).build().unwrap();
        assert_eq!(built.resources.to_string(), "cpu=1,x=3");
        let mut direct = Task::function("f", Vec::new())
            .resources_str("x=2")
            .build()
            .unwrap();
        spec.apply_to(&mut direct).unwrap();
        assert_eq!(direct.resources.to_string(), "x=3");
    }
}
