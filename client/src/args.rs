//! Conversions that let API calls take plain values: `"cpu"` for a resource name, `2` or
//! `"0.5"` for an amount, `"unbounded"` for a capacity.
//!
//! Each trait is implemented for the validated domain type (which cannot fail) and for the
//! plain forms people write (which are checked, and fail with the domain type's own
//! [`TypeError`] saying what was wrong). Integers mean whole units; text uses the same syntax
//! as the CLI (`2`, `0.5`, `unbounded`).

use escher_proto::{Amount, Capacity, Delta, ResourceName, TypeError};

/// A value that names a resource: a [`ResourceName`], or text checked against its grammar.
pub trait IntoResourceName {
    /// The validated name.
    fn into_resource_name(self) -> Result<ResourceName, TypeError>;
}

impl IntoResourceName for ResourceName {
    fn into_resource_name(self) -> Result<ResourceName, TypeError> {
        Ok(self)
    }
}

impl IntoResourceName for &ResourceName {
    fn into_resource_name(self) -> Result<ResourceName, TypeError> {
        Ok(self.clone())
    }
}

impl IntoResourceName for &str {
    fn into_resource_name(self) -> Result<ResourceName, TypeError> {
        ResourceName::new(self)
    }
}

impl IntoResourceName for String {
    fn into_resource_name(self) -> Result<ResourceName, TypeError> {
        ResourceName::new(&self)
    }
}

impl IntoResourceName for &String {
    fn into_resource_name(self) -> Result<ResourceName, TypeError> {
        ResourceName::new(self)
    }
}

/// A value that is an amount of a resource: an [`Amount`], a whole number of units, or text
/// such as `"0.5"`.
pub trait IntoAmount {
    /// The validated amount.
    fn into_amount(self) -> Result<Amount, TypeError>;
}

impl IntoAmount for Amount {
    fn into_amount(self) -> Result<Amount, TypeError> {
        Ok(self)
    }
}

impl IntoAmount for &str {
    fn into_amount(self) -> Result<Amount, TypeError> {
        self.parse()
    }
}

impl IntoAmount for u32 {
    fn into_amount(self) -> Result<Amount, TypeError> {
        Amount::units(u64::from(self))
    }
}

impl IntoAmount for u64 {
    fn into_amount(self) -> Result<Amount, TypeError> {
        Amount::units(self)
    }
}

impl IntoAmount for usize {
    fn into_amount(self) -> Result<Amount, TypeError> {
        Amount::units(self as u64)
    }
}

impl IntoAmount for i32 {
    /// Whole units; negative numbers are rejected. (This is the type of a bare literal `2`.)
    fn into_amount(self) -> Result<Amount, TypeError> {
        let units = u64::try_from(self).map_err(|_| TypeError::InvalidAmount {
            text: self.to_string(),
            why: "amounts cannot be negative",
        })?;
        Amount::units(units)
    }
}

/// A value that is a capacity: a [`Capacity`], an amount (finite), or text such as `"4"` or
/// `"unbounded"`.
pub trait IntoCapacity {
    /// The validated capacity.
    fn into_capacity(self) -> Result<Capacity, TypeError>;
}

impl IntoCapacity for Capacity {
    fn into_capacity(self) -> Result<Capacity, TypeError> {
        Ok(self)
    }
}

impl IntoCapacity for &str {
    fn into_capacity(self) -> Result<Capacity, TypeError> {
        self.parse()
    }
}

macro_rules! capacity_from_amount {
    ($($t:ty),*) => {$(
        impl IntoCapacity for $t {
            fn into_capacity(self) -> Result<Capacity, TypeError> {
                self.into_amount().map(Capacity::Finite)
            }
        }
    )*};
}

capacity_from_amount!(Amount, u32, u64, usize, i32);

/// A value that is a signed change to a capacity: a [`Delta`], a whole number of units (`-2`),
/// or text such as `"+1"` or `"-0.5"`.
pub trait IntoDelta {
    /// The validated change.
    fn into_delta(self) -> Result<Delta, TypeError>;
}

impl IntoDelta for Delta {
    fn into_delta(self) -> Result<Delta, TypeError> {
        Ok(self)
    }
}

impl IntoDelta for &str {
    fn into_delta(self) -> Result<Delta, TypeError> {
        self.parse()
    }
}

impl IntoDelta for i32 {
    fn into_delta(self) -> Result<Delta, TypeError> {
        i64::from(self).into_delta()
    }
}

impl IntoDelta for i64 {
    fn into_delta(self) -> Result<Delta, TypeError> {
        let magnitude = Amount::units(self.unsigned_abs())?;
        Ok(if self < 0 {
            Delta::decrease(magnitude)
        } else {
            Delta::increase(magnitude)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_values_convert_and_bad_ones_say_why() {
        assert_eq!("cpu".into_resource_name().unwrap(), ResourceName::cpu());
        assert!("b@d".into_resource_name().is_err());
        assert_eq!(2.into_amount().unwrap(), Amount::units(2).unwrap());
        assert_eq!("0.5".into_amount().unwrap().raw(), 5_000);
        let err = (-1).into_amount().unwrap_err().to_string();
        assert!(err.contains("negative"), "{err}");
        assert!(u64::MAX.into_amount().is_err());
        assert_eq!("unbounded".into_capacity().unwrap(), Capacity::Unbounded);
        assert_eq!(
            4u32.into_capacity().unwrap(),
            Capacity::Finite(Amount::units(4).unwrap())
        );
        assert!("lots".into_capacity().is_err());
        assert_eq!((-2).into_delta().unwrap().to_string(), "-2");
        assert_eq!("+0.5".into_delta().unwrap().raw(), 5_000);
        assert!(i64::MIN.into_delta().is_err());
    }
}
