#include "tessel/store/store.h"

#include "tessel/base/error.h"

namespace tessel {

Store::~Store() = default;

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : Store(base ? base->timeout() : Nanoseconds::zero()),
      prefix_(std::move(prefix)),
      base_(std::move(base)) {
  TESSEL_CHECK(base_ != nullptr, InvalidArgument, "PrefixStore '{}' needs a store", prefix_);
}

std::vector<std::string> PrefixStore::keys_of(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(key_of(k));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  base_->set(key_of(key), value);
}
std::string PrefixStore::get(const std::string& key, Nanoseconds timeout) {
  return base_->get(key_of(key), timeout);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(key_of(key), delta);
}
std::string PrefixStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  return base_->compare_set(key_of(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, Nanoseconds timeout) {
  base_->wait(keys_of(keys), timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(keys_of(keys));
}
bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(key_of(key)); }
std::vector<std::string> PrefixStore::multi_get(const std::vector<std::string>& keys,
                                                Nanoseconds timeout) {
  return base_->multi_get(keys_of(keys), timeout);
}
void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  base_->multi_set(keys_of(keys), values);
}

}  // namespace tessel
