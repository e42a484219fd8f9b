//! The AMQP values a message is made of (properties, header tables and
//! their field values), named once for the whole crate. They are the client
//! library's own types: an envelope carries them as the broker sent them,
//! and a copy goes out with them unchanged. Every other use of the client
//! library (connections, channels, confirms) stays in [`crate::broker`].

/// AMQP message properties, headers included.
pub type Properties = lapin::BasicProperties;
/// An AMQP field value, and the tables, arrays and strings it is made of.
pub use lapin::types::{AMQPValue as AmqpValue, FieldArray, FieldTable, LongString, ShortString};
